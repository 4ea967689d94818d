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
	"strings"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// Flag is the bench command's flag that makes it the child: run only a
// nats-server with its store in the directory given (Serve).
const Flag = "nats-server"

// Serve runs a nats-server with JetStream on a free loopback port, its
// store in dir, prints its URL on stdout, and serves until stdin closes.
// JetStream may use 8 GiB of memory and 64 GiB of disk: the largest
// benches' meshes.
func Serve(dir string) error {
	ns, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: dir, NoLog: true, NoSigs: true,
		JetStreamMaxMemory: 8 << 30, JetStreamMaxStore: 64 << 30})
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
