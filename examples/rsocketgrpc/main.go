// Command rsocketgrpc runs a gRPC service over rsocket: gRPC's own server
// and client, with an rsocket listener and dialer, and nothing else
// RDMA-specific. The service is gRPC's standard health service, whose
// generated code ships with gRPC, so the example needs no protoc: the
// client asks for the serving status of two services, one the server
// marked serving and one it marked not.
//
// It lives in a module of its own so that rxego's module does not depend
// on gRPC.
//
//	go run . -demo                       # server and client on 127.0.0.1 and 127.0.0.2
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"os"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/rxego/rxego"
	"github.com/rxego/rxego/cm"
	"github.com/rxego/rxego/rsocket"
)

func main() {
	demo := flag.Bool("demo", false, "run the server on 127.0.0.1 and the client on 127.0.0.2")
	flag.Parse()
	if !*demo {
		flag.Usage()
		os.Exit(2)
	}
	if err := run(os.Stdout, "127.0.0.1", "127.0.0.2"); err != nil {
		log.Fatal(err)
	}
}

// manager opens a device on addr with a connection manager.
func manager(addr string) (*cm.Manager, func(), error) {
	dev, err := rxego.Open(addr, nil)
	if err != nil {
		return nil, nil, err
	}
	m, err := cm.New(dev, nil)
	if err != nil {
		dev.Close()
		return nil, nil, err
	}
	return m, func() { m.Close(); dev.Close() }, nil
}

// run serves gRPC's health service over rsocket on srvAddr and queries it
// from cliAddr.
func run(w io.Writer, srvAddr, cliAddr string) error {
	sm, closeSrv, err := manager(srvAddr)
	if err != nil {
		return err
	}
	defer closeSrv()
	cm, closeCli, err := manager(cliAddr)
	if err != nil {
		return err
	}
	defer closeCli()
	ln, err := rsocket.Listen(sm, srvAddr+":0", nil)
	if err != nil {
		return err
	}
	hs := health.NewServer()
	hs.SetServingStatus("kv", healthpb.HealthCheckResponse_SERVING)
	hs.SetServingStatus("batch", healthpb.HealthCheckResponse_NOT_SERVING)
	srv := grpc.NewServer()
	healthpb.RegisterHealthServer(srv, hs)
	go srv.Serve(ln)
	defer srv.Stop()

	conn, err := grpc.NewClient("passthrough:///"+ln.Addr().String(),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
			return rsocket.DialContext(ctx, cm, addr, nil)
		}))
	if err != nil {
		return err
	}
	defer conn.Close()
	client := healthpb.NewHealthClient(conn)
	for _, svc := range []string{"kv", "batch"} {
		resp, err := client.Check(context.Background(), &healthpb.HealthCheckRequest{Service: svc})
		if err != nil {
			return err
		}
		fmt.Fprintf(w, "health of %s over rsocket: %v\n", svc, resp.GetStatus())
	}
	return nil
}
