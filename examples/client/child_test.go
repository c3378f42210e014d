package main

import (
	"context"
	"net"
	"os"
	"path/filepath"

	"github.com/goxrc/goxrc/cm"
	"github.com/goxrc/goxrc/xrc/memfabric"
)

// dirEnv gives the child process (mainexec) the test's temporary
// directory, for its XRC domains.
const dirEnv = "GOXRC_CLIENT_TEST_DIR"

// onFabric, in the child process, runs examples/server's echo mode (the
// mode request, then an echo of every message) on each of addrs of an
// in-memory fabric, and makes main dial there, from a node of its own,
// instead of on a device. With echoes >= 0, the server echoes that many
// messages and closes the connection once the next is in.
func onFabric(echoes int, addrs ...string) {
	fab := memfabric.New()
	dir := os.Getenv(dirEnv)
	ctx := context.Background()
	for _, a := range addrs {
		host, _, _ := net.SplitHostPort(a)
		l, err := cm.Listen(ctx, a, cm.WithFabric(fab.Node(host).Process()), cm.WithDomainPath(filepath.Join(dir, host)))
		if err != nil {
			panic(err)
		}
		go func() {
			for {
				c, err := l.Accept(ctx)
				if err != nil {
					return
				}
				go func() {
					defer c.Close()
					buf := make([]byte, c.MaxRecvSize())
					_, err := c.Recv(ctx, buf) // the mode request
					for i := 0; err == nil && i != echoes; i++ {
						var n int
						if n, err = c.Recv(ctx, buf); err == nil {
							err = c.Send(ctx, buf[:n])
						}
					}
					c.Recv(ctx, buf) // the next: its sender waits on its echo
				}()
			}
		}()
	}
	client := fab.Node("10.7.0.99").Process()
	dial = func(ctx context.Context, addr string, opts ...cm.Option) (*cm.Conn, error) {
		return cm.Dial(ctx, addr, append(opts, cm.WithFabric(client), cm.WithDomainPath(filepath.Join(dir, "client")))...)
	}
}
