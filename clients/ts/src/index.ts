/**
 * The TypeScript client of the mesh-provisioner NATS micro service: the
 * {@link ProvisionerClient}, its errors and discovery types, and the
 * generated protobuf-es types of the contract (package mesh.provisioner.v1).
 *
 * @module
 */
export * from "./client.js";
export * from "./gen/mesh/provisioner/v1/compose_pb.js";
export * from "./gen/mesh/provisioner/v1/provisioning_pb.js";
export * from "./gen/mesh/provisioner/v1/provisions_pb.js";
export * from "./gen/mesh/provisioner/v1/registry_pb.js";
export * from "./gen/mesh/provisioner/v1/state_pb.js";
export * from "./gen/mesh/provisioner/v1/stats_pb.js";
export * from "./gen/mesh/provisioner/v1/write_pb.js";

/**
 * The prefix under which a node's account imports its plan key's writes
 * when the server runs in an account of its own (`mesh-provisioner permissions --runs-as`): the `apiPrefix`
 * option of a node's {@link ProvisionerClient} there. The Go
 * wire.RunsAsAPIPrefix.
 */
export const RUNS_AS_API_PREFIX = "$PROVISIONER.API";
