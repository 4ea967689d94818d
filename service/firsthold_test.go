package service_test

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/novox/mesh-provisioner/internal/testkit/natstest"
	"github.com/novox/mesh-provisioner/internal/testkit/servicetest"
	"github.com/novox/mesh-provisioner/keys"
	"github.com/novox/mesh-provisioner/permissions"
	"github.com/novox/mesh-provisioner/service"
	"github.com/novox/mesh-provisioner/wire"
)

// A service told what it holds by FirstHold binds every bucket before it
// asks: nats-server answers stream infos only when no other JetStream
// API request waits, and an instance sharing the partitions tells the
// others of itself in FirstHold, from which moment they count on it to
// serve its share. It asks discovery whether others serve meanwhile (a
// FirstHold that does not return until it sees the question ends), not
// after, and then serves the partitions FirstHold returns.
func TestStartBindsTheBucketsBeforeItAsksWhatToHold(t *testing.T) {
	t.Parallel()
	const partitions = 4
	server := natstest.StartWithConfig(t, permissions.MappingsConfig(partitions))
	nc := natstest.Connect(t, server)
	servicetest.Buckets(t, nc)

	var mu sync.Mutex
	var asked []string // the JetStream API requests seen, and "FirstHold"
	watch := natstest.Connect(t, server)
	probed := make(chan struct{}, 1)
	for _, subject := range []string{"$JS.API.>", "$SRV.INFO." + wire.ServiceName} {
		sub, err := watch.Subscribe(subject, func(msg *nats.Msg) {
			mu.Lock()
			asked = append(asked, msg.Subject)
			mu.Unlock()
			if msg.Subject != subject {
				return
			}
			select {
			case probed <- struct{}{}:
			default:
			}
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = sub.Unsubscribe() })
	}
	if err := watch.Flush(); err != nil {
		t.Fatal(err)
	}
	svc, err := service.Start(t.Context(), service.Config{Conn: natstest.Connect(t, server), Partitions: partitions, HoldChanges: true,
		FirstHold: func(ctx context.Context) ([]int, error) {
			if err := watch.Flush(); err != nil { // every request sent before is in
				return nil, err
			}
			select {
			case <-probed:
			case <-time.After(5 * time.Second):
				t.Error("no discovery request while FirstHold ran: whether others serve is asked after it")
			}
			mu.Lock()
			asked = append(asked, "FirstHold")
			mu.Unlock()
			return []int{1, 3}, nil
		}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(svc.Stop)
	if err := watch.Flush(); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	hold := slices.Index(asked, "FirstHold")
	if hold < 0 {
		t.Fatal("FirstHold was not called")
	}
	for _, bucket := range keys.Buckets() {
		if info := "$JS.API.STREAM.INFO." + wire.StreamOf(bucket); !slices.Contains(asked[:hold], info) {
			t.Errorf("%s was not bound before FirstHold: requests before it %q", bucket, asked[:hold])
		}
	}
	if got := svc.Held(); !slices.Equal(got, []int{1, 3}) {
		t.Errorf("the service serves partitions %v, want FirstHold's [1 3]", got)
	}
}
