"""An OTLP/gRPC logs receiver for the export test: OpenTelemetry's Python package of the OTLP
protos, served by grpcio. Prints `listening PORT`, then one JSON line per log record received
(its attributes flattened, with its resource's and its body), flushed as it comes. SIGTERM
stops it gracefully: calls in flight are answered first.

    otlp_receiver.py PORT [keep|quiet|reject]    (PORT 0: any free port; keep, the default:
                                                  print each record; quiet: print none, as
                                                  the benchmark wants; reject: answer every
                                                  Export INVALID_ARGUMENT, printing one line
                                                  `{"rejected": RECORDS}` per call instead)
"""

import json
import signal
import sys
import threading
from concurrent import futures

# SIGTERM is blocked in every thread (grpcio's inherit the mask) and taken by `sigwait` in the
# main thread. With a handler instead, the kernel may hand the signal to one of grpcio's
# threads, and Python runs handlers only in the main thread, which sat in `Event.wait` and was
# not woken: the receiver then did not stop (the suite saw one hang past its deadline).
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})

import grpc  # noqa: E402  (after the mask: threads it starts inherit it)
from opentelemetry.proto.collector.logs.v1 import logs_service_pb2, logs_service_pb2_grpc


def value(any_value):
    kind = any_value.WhichOneof("value")
    if kind == "array_value":
        return [value(v) for v in any_value.array_value.values]
    if kind is None:
        return None
    return getattr(any_value, kind)


def flat(key_values):
    return {kv.key: value(kv.value) for kv in key_values}


class Logs(logs_service_pb2_grpc.LogsServiceServicer):
    def __init__(self, mode):
        self.lock = threading.Lock()
        self.mode = mode

    def Export(self, request, context):
        if self.mode == "quiet":
            return logs_service_pb2.ExportLogsServiceResponse()
        if self.mode == "reject":
            records = sum(
                len(scope_logs.log_records)
                for resource_logs in request.resource_logs
                for scope_logs in resource_logs.scope_logs
            )
            with self.lock:
                print(json.dumps({"rejected": records}), flush=True)
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "rejected by the test receiver")
        lines = []
        for resource_logs in request.resource_logs:
            resource = flat(resource_logs.resource.attributes)
            for scope_logs in resource_logs.scope_logs:
                for record in scope_logs.log_records:
                    lines.append(
                        json.dumps(
                            {
                                "attributes": flat(record.attributes),
                                "resource": resource,
                                "scope": scope_logs.scope.name,
                                "body": value(record.body),
                                "severity": record.severity_text,
                                "event_name": record.event_name,
                                "time_unix_nano": record.time_unix_nano,
                            }
                        )
                    )
        # Printed before the answer: a record acknowledged is a record the test has seen.
        with self.lock:
            for line in lines:
                print(line)
            sys.stdout.flush()
        return logs_service_pb2.ExportLogsServiceResponse()


def main():
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    mode = sys.argv[2] if len(sys.argv) > 2 else "keep"
    logs_service_pb2_grpc.add_LogsServiceServicer_to_server(Logs(mode), server)
    port = server.add_insecure_port(f"127.0.0.1:{sys.argv[1]}")
    server.start()
    print(f"listening {port}", flush=True)
    # A SIGTERM sent as soon as the port is said stays pending until here.
    signal.sigwait({signal.SIGTERM})
    server.stop(grace=5).wait()


if __name__ == "__main__":
    main()
