"""Engine replicas on Ray Serve (`stepserve serve --replicas N`, `--pools FILE`): each
replica its own process with its own engine, behind one OpenAI-compatible ingress that
routes with stepserve.routing. Needs the optional `cluster` extra (Ray Serve); nothing
here imports Ray at module level except the modules only the cluster path loads."""
