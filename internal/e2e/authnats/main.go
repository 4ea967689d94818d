// Command authnats runs a nats-server with JetStream whose authorization is
// what `mesh-provisioner permissions` prints, so that the TypeScript and
// Python clients' tests prove a node's own grant on a real authorizing
// server, as the Go tests do (cmd/mesh-provisioner/security_test.go):
//
//	mesh-provisioner         permissions --server
//	mesh-provisioner-writer  permissions --server-writer
//	ace, novox               permissions --node ace, --node novox
//
// each with the password "<user>-secret". It prints one JSON object, the
// URL each user connects with, such as
//
//	{"ace":"nats://ace:ace-secret@127.0.0.1:41234", ...}
//
// and serves until its standard input closes. The store is in a temporary
// directory, removed on exit.
package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
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
	writer, err := permissions.ServerWriter()
	if err != nil {
		return err
	}
	grants := map[string]permissions.Permissions{
		wire.ServerIdentity: permissions.Server(),
		wire.WriterIdentity: writer,
	}
	for _, node := range []string{"ace", "novox"} {
		if grants[node], err = permissions.Node(node); err != nil {
			return err
		}
	}
	var users []*server.User
	for name, p := range grants {
		users = append(users, &server.User{Username: name, Password: name + "-secret", Permissions: &server.Permissions{
			Publish:   &server.SubjectPermission{Allow: p.Publish.Allow, Deny: p.Publish.Deny},
			Subscribe: &server.SubjectPermission{Allow: p.Subscribe.Allow, Deny: p.Subscribe.Deny},
		}})
	}
	dir, err := os.MkdirTemp("", "authnats-")
	if err != nil {
		return err
	}
	defer func() { _ = os.RemoveAll(dir) }()
	ns, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: dir,
		Users: users, NoLog: true, NoSigs: true})
	if err != nil {
		return err
	}
	ns.Start()
	defer ns.Shutdown()
	if !ns.ReadyForConnections(10 * time.Second) {
		return errors.New("nats-server did not start")
	}
	urls := map[string]string{}
	for name := range grants {
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
