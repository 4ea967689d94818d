package client_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/novox/mesh-provisioner/client"
	provisionerv1 "github.com/novox/mesh-provisioner/gen/mesh/provisioner/v1"
	"github.com/novox/mesh-provisioner/internal/testkit/natstest"
	"github.com/novox/mesh-provisioner/wire"
)

// A request for a node on a connection that is not the node's own (its
// answer awaited on an inbox subscribed for it alone) fails as soon as the
// connection closes, as nats.go's own request does, rather than waiting
// out its context.
func TestARequestEndsWhenItsConnectionCloses(t *testing.T) {
	t.Parallel()
	s := natstest.Start(t)
	nc := natstest.Connect(t, s)
	// Something subscribes to ace's compose subject and never answers.
	sink := natstest.Connect(t, s)
	if _, err := sink.SubscribeSync(wire.NodeSubject(wire.ComposeSubject, "ace")); err != nil {
		t.Fatal(err)
	}
	if err := sink.Flush(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := client.New(nc, client.AsNode("ace")).Compose(ctx, &provisionerv1.ComposeRequest{Node: "ace"})
		done <- err
	}()
	time.Sleep(100 * time.Millisecond) // the request is out
	closed := time.Now()
	nc.Close()
	select {
	case err := <-done:
		if !errors.Is(err, nats.ErrConnectionClosed) {
			t.Errorf("the request ended with %v, want %v", err, nats.ErrConnectionClosed)
		}
		if waited := time.Since(closed); waited > 2*time.Second {
			t.Errorf("the request ended %s after its connection closed", waited)
		}
	case <-ctx.Done():
		t.Fatal("the request did not end when its connection closed")
	}
}
