// Package client calls the mesh-provisioner micro service from Go: both
// verbs, mesh-provisioner.provisioning and mesh-provisioner.compose, with
// their typed requests and decoded answers, page by page or whole.
//
//	c := client.New(nc)
//	for page, err := range c.ProvisioningPages(ctx, &provisionerv1.ProvisioningRequest{
//		What: provisionerv1.What_WHAT_NEEDS,
//	}) {
//		if wire.CodeOf(err) == wire.CodeUnavailable { /* ask again shortly */ }
//		...
//	}
//
// A refused request is a *wire.Error, with its code and sentence.
package client
