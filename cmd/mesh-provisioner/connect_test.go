package main

import (
	"os"
	"path/filepath"
	"testing"
)

// The connection settings come, as natscli takes them, from the flags (and
// the command's own variables), then the context (--context, else
// $NATS_CONTEXT), then $NATS_URL, $NATS_CREDS and $NATS_NKEY.
func TestConnectSettingsPrecedence(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	contextFile := filepath.Join(dir, "node-ace.json")
	if err := os.WriteFile(contextFile, []byte(`{"url": "nats://context:4222", "inbox_prefix": "_INBOX_MESH.node.ace", "jetstream_api_prefix": "$PROVISIONER.API"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{"NATS_URL": "nats://env:4222", "NATS_CREDS": "/env.creds"}
	tests := []struct {
		name                   string
		flags                  connectFlags
		env                    map[string]string
		wantURL, wantInbox     string
		wantCreds, wantAPI     string
		wantContextCredentials bool
	}{
		{name: "nothing: the default", env: nil, wantURL: defaultClientURL},
		{name: "the variables", env: env, wantURL: "nats://env:4222", wantCreds: "/env.creds"},
		{name: "the context over the variables", flags: connectFlags{context: contextFile}, env: env,
			wantURL: "nats://context:4222", wantInbox: "_INBOX_MESH.node.ace", wantAPI: "$PROVISIONER.API", wantContextCredentials: true},
		{name: "$NATS_CONTEXT as --context", env: map[string]string{"NATS_CONTEXT": contextFile, "NATS_URL": "nats://env:4222"},
			wantURL: "nats://context:4222", wantInbox: "_INBOX_MESH.node.ace", wantAPI: "$PROVISIONER.API", wantContextCredentials: true},
		{name: "the flags over the context", flags: connectFlags{context: contextFile, url: "nats://flag:4222", inbox: "_INBOX_MESH.node.bob", creds: "/flag.creds"}, env: env,
			wantURL: "nats://flag:4222", wantInbox: "_INBOX_MESH.node.bob", wantCreds: "/flag.creds", wantAPI: "$PROVISIONER.API"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			c := tt.flags
			if err := c.resolve(envOf(tt.env), defaultClientURL); err != nil {
				t.Fatal(err)
			}
			if c.url != tt.wantURL || c.inbox != tt.wantInbox || c.creds != tt.wantCreds || c.apiPrefix != tt.wantAPI || (c.contextOptions != nil) != tt.wantContextCredentials {
				t.Errorf("resolved url %q inbox %q creds %q api %q context options %v; want %q %q %q %q %v",
					c.url, c.inbox, c.creds, c.apiPrefix, c.contextOptions != nil, tt.wantURL, tt.wantInbox, tt.wantCreds, tt.wantAPI, tt.wantContextCredentials)
			}
		})
	}
	t.Run("a context natscli does not know", func(t *testing.T) {
		t.Parallel()
		c := connectFlags{context: "no-such-context-anywhere"}
		if err := c.resolve(envOf(nil), defaultClientURL); err == nil {
			t.Error("want an error naming the context")
		}
	})
}
