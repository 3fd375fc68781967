// plegd's API for Go: the stubs of proto/proto/plegd/v1/plegd.proto (package plegdv1) and an
// example that follows Watch (example/watch). Generated with Debian 12's protoc 3.21,
// protoc-gen-go 1.28 and protoc-gen-go-grpc 1.33 (tests/tests/go_client.rs regenerates and
// compares); outside this repository, require it with a replace directive pointing here.
module plegd.local/proto

go 1.19

require (
	google.golang.org/grpc v1.33.3
	google.golang.org/protobuf v1.28.1
)
