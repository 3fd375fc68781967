// Command watch follows plegd's events over its unix socket the way README's Python snippet
// does, and keeps following across disconnects and daemon restarts: it lists the pods, then
// watches from the listing's sequence + 1 with its run id; when the stream breaks it resumes
// after the last event it printed, and when plegd says those events are gone (OUT_OF_RANGE: a
// new run, or history too short) it lists again and watches from there.
//
//	go run ./example/watch /run/plegd/plegd.sock
//
// Each event is printed as one line: sequence, type, namespace/pod, container, exit code.
package main

import (
	"context"
	"fmt"
	"io"
	"log"
	"net"
	"os"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"plegd.local/proto/plegdv1"
)

func main() {
	socket := "/run/plegd/plegd.sock"
	if len(os.Args) > 1 {
		socket = os.Args[1]
	}
	// The socket is dialed by path: grpc-go then sends that path as the :authority, which
	// plegd accepts on its unix socket.
	conn, err := grpc.Dial(socket,
		grpc.WithInsecure(),
		grpc.WithContextDialer(func(ctx context.Context, path string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", path)
		}))
	if err != nil {
		log.Fatalf("dialing %s: %v", socket, err)
	}
	defer conn.Close()
	pleg := plegdv1.NewPlegClient(conn)

	var runID, next uint64
	listed := false
	for {
		if !listed {
			listing, err := pleg.ListPods(context.Background(), &plegdv1.ListPodsRequest{})
			if err != nil {
				log.Printf("listing: %v; again in 1 s", err)
				time.Sleep(time.Second)
				continue
			}
			runID, next, listed = listing.RunId, listing.Sequence+1, true
			fmt.Printf("listed %d pods, run %d, sequence %d\n", len(listing.Pods), runID, listing.Sequence)
		}
		err := follow(pleg, runID, &next)
		switch status.Code(err) {
		case codes.OutOfRange:
			log.Printf("resync: %v", err)
			listed = false
		default:
			log.Printf("stream ended: %v; resuming from %d in 1 s", err, next)
			time.Sleep(time.Second)
		}
	}
}

// follow prints the events of run runID from *next on until the stream ends, advancing *next
// past each one printed.
func follow(pleg plegdv1.PlegClient, runID uint64, next *uint64) error {
	events, err := pleg.Watch(context.Background(), &plegdv1.WatchRequest{
		FromSequence: *next,
		RunId:        runID,
	})
	if err != nil {
		return err
	}
	for {
		event, err := events.Recv()
		if err == io.EOF {
			return status.Error(codes.Unavailable, "the stream ended")
		}
		if err != nil {
			return err
		}
		exit := "-"
		if event.ExitCode != nil {
			exit = fmt.Sprint(*event.ExitCode)
		}
		fmt.Printf("%d %s %s/%s %s %s\n", event.Sequence, event.Type, event.PodNamespace,
			event.PodName, event.ContainerId, exit)
		*next = event.Sequence + 1
	}
}
