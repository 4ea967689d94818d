package client

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/nats-io/nats.go"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"

	provisionerv1 "github.com/novox/mesh-provisioner/gen/mesh/provisioner/v1"
	"github.com/novox/mesh-provisioner/internal/testkit/natstest"
	"github.com/novox/mesh-provisioner/keys"
	"github.com/novox/mesh-provisioner/nodeclient"
)

// The clients agree by test: the node-name rule, the timeouts and the
// states of a plan are data in conformance/clients, which the Go client
// (here, inside package client to read the watch's unexported constants),
// the TypeScript client (clients/ts/test/agree.test.ts) and the Python
// client (clients/python/tests/test_agree.py) each check themselves
// against.

// agreement decodes conformance/clients/<name>.json into v, refusing a
// field v does not know: a field the data gains is a field this test reads.
func agreement(t *testing.T, name string, v any) {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("..", "conformance", "clients", name+".json"))
	if err != nil {
		t.Fatal(err)
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		t.Fatalf("%s.json: %v", name, err)
	}
}

// skipPending skips a check the data says is pending, unless
// CONFORMANCE_RUN_PENDING is set, as the conformance suite's runners do.
func skipPending(t *testing.T, pending map[string]string, check string) {
	t.Helper()
	if why := pending[check]; why != "" && os.Getenv("CONFORMANCE_RUN_PENDING") == "" {
		t.Skipf("pending: %s", why)
	}
}

type nodeNames struct {
	About  string              `json:"about"`
	Checks map[string][]string `json:"checks"`
	Names  []struct {
		About    string            `json:"about"`
		Name     string            `json:"name"`
		Accepted bool              `json:"accepted"`
		Pending  map[string]string `json:"pending"`
	} `json:"names"`
}

func TestAgreeNodeNames(t *testing.T) {
	t.Parallel()
	var data nodeNames
	agreement(t, "node-names", &data)

	// A closed connection: a name the client takes gets as far as the
	// connection, which refuses everything; nothing is sent.
	closed := natstest.Connect(t, natstest.Start(t))
	closed.Close()
	// Each check reports whether the client took the name.
	checks := map[string]func(name string) (bool, error){
		"nodeclient.New": func(name string) (bool, error) {
			_, err := nodeclient.New(context.Background(), nodeclient.Config{Conn: closed, Node: name})
			if err != nil && !errors.Is(err, keys.ErrInvalidPart) {
				return false, fmt.Errorf("refused otherwise than as a name: %w", err)
			}
			return err == nil, nil
		},
		"client.WatchPlan": func(name string) (bool, error) {
			err := New(closed).WatchPlan(context.Background(), name, func(*provisionerv1.ComposeResponse) error { return nil })
			switch {
			case err == nil:
				return false, errors.New("WatchPlan returned nil on a closed connection")
			case errors.Is(err, nats.ErrConnectionClosed):
				return true, nil // past the name, at the subscription
			}
			return false, nil
		},
	}
	if diff := cmp.Diff(slices.Sorted(maps.Keys(checks)), slices.Sorted(slices.Values(data.Checks["go"]))); diff != "" {
		t.Fatalf("the Go checks this test makes (-) and those the data names (+):\n%s", diff)
	}

	for _, check := range data.Checks["go"] {
		for _, n := range data.Names {
			t.Run(check+"/"+n.About, func(t *testing.T) {
				t.Parallel()
				skipPending(t, n.Pending, check)
				took, err := checks[check](n.Name)
				if err != nil {
					t.Fatalf("%s(%q): %v", check, keys.Echo(n.Name), err)
				}
				if took != n.Accepted {
					t.Errorf("%s(%q) took the name: %t, want %t", check, keys.Echo(n.Name), took, n.Accepted)
				}
			})
		}
	}
}

type timeouts struct {
	About    string `json:"about"`
	Timeouts []struct {
		About  string  `json:"about"`
		MS     int64   `json:"ms"`
		Go     *string `json:"go"`
		TS     *string `json:"ts"`
		Python *string `json:"python"`
	} `json:"timeouts"`
}

func TestAgreeTimeouts(t *testing.T) {
	t.Parallel()
	var data timeouts
	agreement(t, "timeouts", &data)

	constants := map[string]time.Duration{
		"client.watchRetryMin":       watchRetryMin,
		"client.watchRetryMax":       watchRetryMax,
		"client.watchComposeTimeout": watchComposeTimeout,
		"client.watchFlushTimeout":   watchFlushTimeout,
		"nodeclient.DefaultTimeout":  nodeclient.DefaultTimeout,
	}
	named := 0
	for _, timeout := range data.Timeouts {
		if timeout.Go == nil {
			continue
		}
		named++
		t.Run(*timeout.Go, func(t *testing.T) {
			t.Parallel()
			got, ok := constants[*timeout.Go]
			if !ok {
				t.Fatalf("no Go constant %s: %s", *timeout.Go, timeout.About)
			}
			if want := time.Duration(timeout.MS) * time.Millisecond; got != want {
				t.Errorf("%s = %s, want %s: %s", *timeout.Go, got, want, timeout.About)
			}
		})
	}
	if named != len(constants) {
		t.Errorf("the data names %d Go constants, this test knows %d: name each in conformance/clients/timeouts.json", named, len(constants))
	}
}

type planStates struct {
	About     string `json:"about"`
	Functions map[string]struct {
		About  string `json:"about"`
		Go     string `json:"go"`
		TS     string `json:"ts"`
		Python string `json:"python"`
	} `json:"functions"`
	Cases []struct {
		About       string          `json:"about"`
		Function    string          `json:"function"`
		Plan        json.RawMessage `json:"plan"`
		Build       string          `json:"build"`
		Provision   json.RawMessage `json:"provision"`
		Composition json.RawMessage `json:"composition"`
		Want        json.RawMessage `json:"want"`
	} `json:"cases"`
}

// decodeJSON decodes protobuf JSON into m.
func decodeJSON[M proto.Message](t *testing.T, data json.RawMessage, m M) M {
	t.Helper()
	if err := protojson.Unmarshal(data, m); err != nil {
		t.Fatalf("decode %s: %v", m.ProtoReflect().Descriptor().Name(), err)
	}
	return m
}

// decodeList decodes a JSON array of protobuf JSON messages.
func decodeList[M proto.Message](t *testing.T, data json.RawMessage, empty func() M) []M {
	t.Helper()
	var raw []json.RawMessage
	if err := json.Unmarshal(data, &raw); err != nil {
		t.Fatal(err)
	}
	list := make([]M, 0, len(raw))
	for _, r := range raw {
		list = append(list, decodeJSON(t, r, empty()))
	}
	return list
}

func TestAgreePlanStates(t *testing.T) {
	t.Parallel()
	var data planStates
	agreement(t, "plan-states", &data)

	planAt := map[string]func(*provisionerv1.ModulePlan, string) []*provisionerv1.PlanItem{"PlanAt": PlanAt}
	isBound := map[string]func(*provisionerv1.Provision) bool{"IsBound": IsBound}
	pending := map[string]func(*provisionerv1.ComposeResponse) []*provisionerv1.Provision{"Pending": Pending}
	if got := slices.Sorted(maps.Keys(data.Functions)); !slices.Equal(got, []string{"is_bound", "pending", "plan_at"}) {
		t.Fatalf("the data names the functions %q; this test knows is_bound, pending and plan_at", got)
	}

	opts := cmp.Options{protocmp.Transform(), cmpopts.EquateEmpty()}
	for _, c := range data.Cases {
		name := data.Functions[c.Function].Go
		t.Run(name+"/"+c.About, func(t *testing.T) {
			t.Parallel()
			switch c.Function {
			case "plan_at":
				fn, ok := planAt[name]
				if !ok {
					t.Fatalf("no Go function %s", name)
				}
				plan := decodeJSON(t, c.Plan, &provisionerv1.ModulePlan{})
				got := fn(plan, c.Build)
				want := decodeList(t, c.Want, func() *provisionerv1.PlanItem { return &provisionerv1.PlanItem{} })
				if diff := cmp.Diff(want, got, opts); diff != "" {
					t.Errorf("%s(%q) (-want +got):\n%s", name, c.Build, diff)
				}
				// The plan's own items, not copies.
				for _, item := range got {
					if !slices.Contains(plan.GetItems(), item) {
						t.Errorf("%s(%q) returned an item the plan does not hold: %v", name, c.Build, item)
					}
				}
			case "is_bound":
				fn, ok := isBound[name]
				if !ok {
					t.Fatalf("no Go function %s", name)
				}
				var want bool
				if err := json.Unmarshal(c.Want, &want); err != nil {
					t.Fatal(err)
				}
				if got := fn(decodeJSON(t, c.Provision, &provisionerv1.Provision{})); got != want {
					t.Errorf("%s = %t, want %t", name, got, want)
				}
			case "pending":
				fn, ok := pending[name]
				if !ok {
					t.Fatalf("no Go function %s", name)
				}
				composition := decodeJSON(t, c.Composition, &provisionerv1.ComposeResponse{})
				got := fn(composition)
				want := decodeList(t, c.Want, func() *provisionerv1.Provision { return &provisionerv1.Provision{} })
				if diff := cmp.Diff(want, got, opts); diff != "" {
					t.Errorf("%s (-want +got):\n%s", name, diff)
				}
				for _, p := range got {
					if !slices.Contains(composition.GetProvisions(), p) {
						t.Errorf("%s returned a provision the composition does not hold: %v", name, p)
					}
				}
			default:
				t.Fatalf("no function %q", c.Function)
			}
		})
	}
}
