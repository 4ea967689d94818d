package service_test

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"

	"github.com/novox/mesh-provisioner/client"
	provisionerv1 "github.com/novox/mesh-provisioner/gen/mesh/provisioner/v1"
	"github.com/novox/mesh-provisioner/internal/testkit/natstest"
	"github.com/novox/mesh-provisioner/internal/testkit/servicetest"
	"github.com/novox/mesh-provisioner/keys"
	"github.com/novox/mesh-provisioner/service"
)

// BenchmarkProvisioningPages walks every node's needs, 16 MB of them, in
// pages of service.DefaultPageMaxBytes against pages filled to max_payload
// (1 MB), each built anew (no answer cache): what smaller pages cost a
// listing. Compare the two in one run:
//
//	go test -run '^$' -bench BenchmarkProvisioningPages -count 5 ./service
func BenchmarkProvisioningPages(b *testing.B) {
	for _, tt := range []struct {
		name     string
		pageSize int
	}{{"page=512KiB", service.DefaultPageMaxBytes}, {"page=max_payload", 1 << 20}} {
		b.Run(tt.name, func(b *testing.B) {
			nc := natstest.Connect(b, natstest.Start(b))
			servicetest.Start(b, nc, func(c *service.Config) {
				c.PageMaxBytes, c.NoAnswerCache, c.Logger = tt.pageSize, true, slog.New(slog.DiscardHandler)
			})
			needs := servicetest.Bucket(b, nc, keys.NeedsBucket)
			const nodes, each, size = 5, 400, 8 << 10
			local := strings.Repeat("x", size)
			var last uint64
			for n := range nodes {
				for i := range each {
					value := encode(b, &provisionerv1.Need{Placeholder: fmt.Sprintf("${dir:d%03d}", i), Local: local})
					last = put(b, needs, fmt.Sprintf("node%d.web.dir.d%03d", n, i), value)
				}
			}
			c := client.New(nc)
			ctx := context.Background()
			req := &provisionerv1.ProvisioningRequest{What: provisionerv1.What_WHAT_NEEDS, MinRevision: last}
			b.SetBytes(nodes * each * size)
			b.ResetTimer()
			for b.Loop() {
				pages := 0
				for _, err := range c.ProvisioningPages(ctx, req) {
					if err != nil {
						b.Fatal(err)
					}
					pages++
				}
				b.ReportMetric(float64(pages), "pages/op")
			}
		})
	}
}
