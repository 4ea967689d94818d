// Package client calls the mesh-provisioner micro service from Go: the typed
// request of the verb mesh-provisioner.provisioning, its decoded answer, and
// the service's coded errors as *ServiceError.
//
//	c := client.New(nc)
//	answer, err := c.Provisioning(ctx, &provisionerv1.ProvisioningRequest{
//		What: provisionerv1.What_WHAT_NEEDS,
//		Node: "ace",
//	})
//	var serr *client.ServiceError
//	if errors.As(err, &serr) && serr.Code == 503 { /* ask again shortly */ }
package client
