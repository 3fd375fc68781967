"""A plegd.v1 client in Python (grpcio, C-core) with the channel's defaults, run by
tests/tests/python_client.rs: ListPods, a Watch resumed from the listing that sees the kill of
CONTAINER, SyncPods whose initial syncs show the container's pod with it exited, and
grpc.health.v1 Check. Prints one line per step; exits non-zero on any failure.

Usage: plegd_client.py SOCKET STUBS_DIR CONTAINER_ID
"""

import sys
import time

import grpc

socket, stubs, container = sys.argv[1:4]
sys.path.insert(0, stubs)
from plegd.v1 import plegd_pb2, plegd_pb2_grpc  # noqa: E402


def say(*words):
    print(*words, flush=True)


# The target form the gRPC docs give for unix sockets; no channel options.
channel = grpc.insecure_channel(f"unix:{socket}")
pleg = plegd_pb2_grpc.PlegStub(channel)

listing = pleg.ListPods(plegd_pb2.ListPodsRequest(), timeout=30)
listed = [c.id for pod in listing.pods for c in pod.containers]
if container not in listed:
    sys.exit(f"ListPods does not list {container}: {listed}")
say("listed", len(listing.pods), listing.run_id, listing.sequence)

# Following changes from the listing on, as the API reference says: sequence + 1, run_id.
events = pleg.Watch(
    plegd_pb2.WatchRequest(from_sequence=listing.sequence + 1, run_id=listing.run_id),
    timeout=60,
)
say("ready")
for event in events:
    if event.container_id == container and event.type == plegd_pb2.CONTAINER_DIED:
        say("died", event.sequence, plegd_pb2.TriggerSource.Name(event.sources[0]),
            event.exit_code if event.HasField("exit_code") else "none")
        events.cancel()
        break
else:
    sys.exit("the watch ended without the container's death")

# The pod's level: SyncPods with initial syncs starts with every pod's current status (or
# with the pod's event sync, if one came meanwhile: the latest wins).
syncs = pleg.SyncPods(plegd_pb2.SyncPodsRequest(initial=True), timeout=60)
for sync in syncs:
    mine = [c for c in sync.status.containers if c.id == container]
    if mine:
        say("synced", plegd_pb2.SyncReason.Name(sync.reason),
            plegd_pb2.ContainerState.Name(mine[0].state), mine[0].exit_code, sync.sequence)
        syncs.cancel()
        break
else:
    sys.exit("the sync stream ended without the container's pod")

# grpc.health.v1 without its generated stubs: HealthCheckRequest{service: ""} is empty, and
# HealthCheckResponse is field 1, a varint status (1: SERVING, 2: NOT_SERVING).
# plegd updates it every second: a daemon that just started may not be SERVING yet.
check = channel.unary_unary("/grpc.health.v1.Health/Check")
for _ in range(100):
    response = check(b"", timeout=30)
    status = {b"\x08\x01": "SERVING", b"\x08\x02": "NOT_SERVING"}.get(response, repr(response))
    if status == "SERVING":
        break
    time.sleep(0.1)
say("health", status)
