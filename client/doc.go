// Package client calls the mesh-provisioner micro service from Go: the read
// verbs mesh-provisioner.provisioning, mesh-provisioner.compose and a
// provider's mesh-provisioner.provisions.<provider>, with their typed
// requests and decoded answers, page by page or whole; a provider's writes
// of its own bucket ([Client.Bind], [Client.Unbind]); and a node's plan,
// composed again each time its digest changes ([Client.WatchPlan]). A node
// writes its own records with package nodeclient.
//
//	c := client.New(nc)
//	for page, err := range c.ProvisioningPages(ctx, &provisionerv1.ProvisioningRequest{
//		What: provisionerv1.What_WHAT_NEEDS,
//	}) {
//		if wire.CodeOf(err) == wire.CodeUnavailable { /* ask again shortly */ }
//		...
//	}
//
// Each identity of the mesh connects with its own inbox prefix ([Inbox]),
// and a node asks on its own subjects ([AsNode]). A refused request is a
// *wire.Error, with its code and sentence.
package client
