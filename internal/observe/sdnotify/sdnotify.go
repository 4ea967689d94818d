// Package sdnotify tells systemd how a service of Type=notify is doing:
// READY=1 once it serves, STOPPING=1 as it begins to stop (sd_notify(3)).
//
// It is the protocol's few lines rather than a library: one datagram of
// "KEY=value" lines to the unix socket named by $NOTIFY_SOCKET (a path, or
// an abstract socket when it starts with "@"). github.com/coreos/go-systemd's
// daemon package does the same in as many lines, and would bring a module
// whose other packages need D-Bus into go.sum for nothing more.
package sdnotify

import (
	"errors"
	"net"
	"os"
)

// Messages systemd reads.
const (
	Ready    = "READY=1"
	Stopping = "STOPPING=1"
)

// Socket is the variable systemd sets for a Type=notify service.
const Socket = "NOTIFY_SOCKET"

// Notify sends state to the socket $NOTIFY_SOCKET names. It reports false,
// and does nothing, when the variable is unset: the program does not run
// under systemd (or its unit is not Type=notify).
func Notify(state string) (bool, error) {
	return NotifySocket(os.Getenv(Socket), state)
}

// NotifySocket sends state to socket; an empty socket does nothing.
func NotifySocket(socket, state string) (bool, error) {
	if socket == "" {
		return false, nil
	}
	addr := &net.UnixAddr{Name: socket, Net: "unixgram"}
	if socket[0] == '@' {
		addr.Name = "\x00" + socket[1:] // Linux's abstract namespace
	}
	conn, err := net.DialUnix("unixgram", nil, addr)
	if err != nil {
		return false, err
	}
	_, werr := conn.Write([]byte(state))
	return werr == nil, errors.Join(werr, conn.Close())
}
