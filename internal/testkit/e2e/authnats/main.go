// Command authnats runs a nats-server with JetStream whose authorization is
// what `mesh-provisioner permissions` prints, so that the TypeScript and
// Python clients' tests prove a node's own grant on a real authorizing
// server, as the Go tests do (cmd/mesh-provisioner/security_test.go):
//
//	mesh-provisioner         permissions --server
//	mesh-provisioner-writer  permissions --server-writer
//	ace, novox               permissions --node ace --providers pg, --node novox
//	pg                       permissions --provider pg
//
// each with the password "<user>-secret". With -runs-as, its accounts are
// what `mesh-provisioner permissions --runs-as ace,novox --providers pg
// --hosts ace:pg` prints instead: the service's two identities in
// PROVISIONER, ace, novox and pg each in an account of its own (which
// imports its own verbs as they are and, a node's, its plan key under
// wire.RunsAsAPIPrefix). It prints one JSON object,
// the URL each user connects with, such as
//
//	{"ace":"nats://ace:ace-secret@127.0.0.1:41234", ...}
//
// and serves until its standard input closes. The store is in a temporary
// directory, removed on exit.
package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/url"
	"os"
	"path/filepath"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/novox/mesh-provisioner/permissions"
	"github.com/novox/mesh-provisioner/wire"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "authnats:", err)
		os.Exit(1)
	}
}

func run() error {
	runsAs := flag.Bool("runs-as", false, "the accounts of permissions --runs-as ace,novox, not one account")
	flag.Parse()
	dir, err := os.MkdirTemp("", "authnats-")
	if err != nil {
		return err
	}
	defer func() { _ = os.RemoveAll(dir) }()
	names := []string{wire.ServerIdentity, wire.WriterIdentity, "ace", "novox", "pg"}
	var opts *server.Options
	if *runsAs {
		opts, err = runsAsOptions(dir, names)
	} else {
		opts, err = oneAccountOptions(dir)
	}
	if err != nil {
		return err
	}
	opts.Host, opts.Port, opts.NoLog, opts.NoSigs = "127.0.0.1", -1, true, true
	ns, err := server.NewServer(opts)
	if err != nil {
		return err
	}
	ns.Start()
	defer ns.Shutdown()
	if !ns.ReadyForConnections(10 * time.Second) {
		return errors.New("nats-server did not start")
	}
	urls := map[string]string{}
	for _, name := range names {
		u, err := url.Parse(ns.ClientURL())
		if err != nil {
			return err
		}
		u.User = url.UserPassword(name, name+"-secret")
		urls[name] = u.String()
	}
	if err := json.NewEncoder(os.Stdout).Encode(urls); err != nil {
		return err
	}
	_, _ = io.Copy(io.Discard, os.Stdin)
	return nil
}

// oneAccountOptions are a server's whose users are the four identities,
// each with its generated permissions, in one account.
func oneAccountOptions(dir string) (*server.Options, error) {
	writer, err := permissions.ServerWriter("pg")
	if err != nil {
		return nil, err
	}
	grants := map[string]permissions.Permissions{
		wire.ServerIdentity: permissions.Server(),
		wire.WriterIdentity: writer,
	}
	if grants["ace"], err = permissions.Node("ace", "pg"); err != nil {
		return nil, err
	}
	if grants["novox"], err = permissions.Node("novox"); err != nil {
		return nil, err
	}
	if grants["pg"], err = permissions.Provider("pg"); err != nil {
		return nil, err
	}
	var users []*server.User
	for name, p := range grants {
		users = append(users, &server.User{Username: name, Password: name + "-secret", Permissions: &server.Permissions{
			Publish:   &server.SubjectPermission{Allow: p.Publish.Allow, Deny: p.Publish.Deny},
			Subscribe: &server.SubjectPermission{Allow: p.Subscribe.Allow, Deny: p.Subscribe.Deny},
		}})
	}
	return &server.Options{JetStream: true, StoreDir: dir, Users: users}, nil
}

// runsAsOptions are a server's whose accounts are what permissions
// --runs-as prints, read as nats-server reads its configuration file: the
// passwords from the environment, as an operator's would be.
func runsAsOptions(dir string, users []string) (*server.Options, error) {
	accounts, err := permissions.RunsAs{Nodes: []string{"ace", "novox"}, Providers: []string{"pg"}, Hosts: map[string][]string{"ace": {"pg"}}}.Config()
	if err != nil {
		return nil, err
	}
	for _, user := range users {
		if err := os.Setenv(permissions.PasswordVariable(user), user+"-secret"); err != nil {
			return nil, err
		}
	}
	file := filepath.Join(dir, "nats-server.conf")
	config := fmt.Sprintf("jetstream { store_dir: %q }\n%s\n", filepath.Join(dir, "jetstream"), accounts)
	if err := os.WriteFile(file, []byte(config), 0o600); err != nil {
		return nil, err
	}
	return server.ProcessConfigFile(file)
}
