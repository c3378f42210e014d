package xrc_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/goxrc/goxrc/xrc"
	"github.com/goxrc/goxrc/xrc/memfabric"
)

// Two endpoints, each one process's engine on its own node, exchange a
// message over XRC. Here they run on an in-memory fabric (Config.Process):
// the exported fabric is all a user needs, no kernel types in sight. On a
// device with XRC, leave Process out and listen on the device's address.
func ExampleNewEndpoint() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	dir, err := os.MkdirTemp("", "goxrc-example")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer os.RemoveAll(dir)
	f := memfabric.New()

	srv, err := xrc.NewEndpoint(ctx, xrc.Config{Process: f.Node("10.3.0.1").Process(), Addr: "10.3.0.1:7000",
		DomainDir: filepath.Join(dir, "server")})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer srv.Close()
	go func() {
		c, err := srv.Accept(ctx)
		if err != nil {
			return
		}
		defer c.Close()
		buf := make([]byte, c.MaxRecvSize())
		n, err := c.Recv(ctx, buf)
		if err == nil {
			c.Send(ctx, append([]byte("echo: "), buf[:n]...)) // a failure reaches the dialer's Recv
		}
	}()

	cli, err := xrc.NewEndpoint(ctx, xrc.Config{Process: f.Node("10.3.0.2").Process(), Addr: "10.3.0.2:7000",
		DomainDir: filepath.Join(dir, "client")})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer cli.Close()
	c, err := cli.Dial(ctx, "10.3.0.1:7000")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer c.Close()
	if err := c.Send(ctx, []byte("hello")); err != nil {
		fmt.Println(err)
		return
	}
	buf := make([]byte, c.MaxRecvSize())
	n, err := c.Recv(ctx, buf)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(string(buf[:n]))
	// Output: echo: hello
}
