// Package benchnats runs the bench commands' nats-server in a child process
// of its own (the bench's binary again, with -nats-server DIR), so that the
// server's CPU and memory are not counted as the measured process's, and
// the service is measured across a real connection.
package benchnats

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// Flag is the bench command's flag that makes it the child: run only a
// nats-server with its store in the directory given (Serve).
const Flag = "nats-server"

// ConfigFile is the configuration Serve reads in its directory, if there
// is one (StartWith writes it): the bench's users and their permissions.
const ConfigFile = "nats-server.conf"

// Serve runs a nats-server with JetStream on a free loopback port, its
// store in dir, prints its URL on stdout, and serves until stdin closes.
// JetStream may use 8 GiB of memory and 64 GiB of disk: the largest
// benches' meshes.
func Serve(dir string) error {
	opts := &server.Options{}
	if file := filepath.Join(dir, ConfigFile); fileExists(file) {
		var err error
		if opts, err = server.ProcessConfigFile(file); err != nil {
			return err
		}
	}
	opts.Host, opts.Port, opts.JetStream, opts.StoreDir, opts.NoLog, opts.NoSigs = "127.0.0.1", -1, true, dir, true, true
	opts.JetStreamMaxMemory, opts.JetStreamMaxStore = 8<<30, 64<<30
	ns, err := server.NewServer(opts)
	if err != nil {
		return err
	}
	ns.Start()
	defer ns.Shutdown()
	if !ns.ReadyForConnections(10 * time.Second) {
		return errors.New("nats-server did not start")
	}
	fmt.Println(ns.ClientURL())
	_, _ = io.Copy(io.Discard, os.Stdin)
	return nil
}

func fileExists(file string) bool {
	_, err := os.Stat(file)
	return err == nil
}

// StartWith is Start with config, a nats-server configuration (its users and
// their permissions, say), written to dir's ConfigFile first.
func StartWith(dir, config string) (url string, stop func(), err error) {
	if err := os.WriteFile(filepath.Join(dir, ConfigFile), []byte(config), 0o600); err != nil {
		return "", nil, err
	}
	return Start(dir)
}

// Start starts this program as a nats-server (-nats-server dir) in a child
// process and returns its URL, and how to stop it.
func Start(dir string) (url string, stop func(), err error) {
	cmd := exec.Command(os.Args[0], "-"+Flag, dir)
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return "", nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return "", nil, err
	}
	if err := cmd.Start(); err != nil {
		return "", nil, err
	}
	stop = func() {
		_ = stdin.Close()
		_ = cmd.Wait()
	}
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		stop()
		return "", nil, fmt.Errorf("the nats-server process: %w", err)
	}
	return strings.TrimSpace(line), stop, nil
}
