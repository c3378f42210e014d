package memfabric_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/goxrc/goxrc/xrc"
	"github.com/goxrc/goxrc/xrc/memfabric"
)

// A node whose device has a shallow send queue, for code that must behave
// when an INI's queue is full (its senders wait; nothing fails), and a
// server endpoint that takes messages of up to 4 KiB, which its peers
// learn when they connect.
func ExampleFabric_AddNode() {
	f := memfabric.New()
	f.AddNode("10.2.0.1", memfabric.NodeConfig{SendQueueDepth: 2})
	ctx := context.Background()
	srv, err := xrc.NewEndpoint(ctx, xrc.Config{Process: f.Node("10.2.0.2").Process(), Addr: "10.2.0.2:7000",
		MaxMessageSize: 4096})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer srv.Close()
	cli, err := xrc.NewEndpoint(ctx, xrc.Config{Process: f.Node("10.2.0.1").Process(), Addr: "10.2.0.1:7000"})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer cli.Close()

	const n = 100
	got := make(chan int)
	go func() {
		c, err := srv.Accept(ctx)
		if err != nil {
			close(got)
			return
		}
		buf := make([]byte, 4096)
		i := 0
		for ; i < n; i++ {
			if k, err := c.Recv(ctx, buf); err != nil || k != 8 || buf[0] != byte(i) {
				break
			}
		}
		got <- i
	}()
	c, err := cli.Dial(ctx, "10.2.0.2:7000")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer c.Close()
	fmt.Println("the server takes messages of up to", c.MaxMessageSize(), "bytes")
	for i := range n {
		if err := c.Send(ctx, []byte{byte(i), 0, 0, 0, 0, 0, 0, 0}); err != nil {
			fmt.Println(err)
			return
		}
	}
	fmt.Println(<-got, "messages received in order; uplinks rebuilt:", cli.Stats().Recoveries)
	// Output:
	// the server takes messages of up to 4096 bytes
	// 100 messages received in order; uplinks rebuilt: 0
}

// A device that fails for good under a connection: the connection's calls
// fail with ErrDeviceRemoved, and the endpoint lets go of everything on the
// device by itself.
func ExampleNode_FailDevice() {
	f := memfabric.New()
	ctx := context.Background()
	srv, err := xrc.NewEndpoint(ctx, xrc.Config{Process: f.Node("10.2.1.2").Process(), Addr: "10.2.1.2:7000"})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer srv.Close()
	p := f.Node("10.2.1.1").Process()
	cli, err := xrc.NewEndpoint(ctx, xrc.Config{Process: p, Addr: "10.2.1.1:7000"})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer cli.Close()
	go func() {
		if c, err := srv.Accept(ctx); err == nil {
			defer c.Close()
			c.Recv(ctx, make([]byte, 64)) // until the client's device is gone
		}
	}()
	c, err := cli.Dial(ctx, "10.2.1.2:7000")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer c.Close()

	f.Node("10.2.1.1").FailDevice()
	_, err = c.Recv(ctx, make([]byte, 64))
	fmt.Println("device removed:", errors.Is(err, xrc.ErrDeviceRemoved))
	for i := 0; i < 5000 && p.Handles() > 0; i++ {
		time.Sleep(time.Millisecond) // the endpoint closes itself in the background
	}
	fmt.Println("kernel handles left:", p.Handles())
	// Output:
	// device removed: true
	// kernel handles left: 0
}

// The main use: a fabric with a node for each side, an engine on a process
// of each (xrc.Config.Process; package cm's Listen and Dial take one with
// cm.WithFabric), a connection between them, and a fault: the client's
// process killed as kill -9 would, which its peer learns of as the real
// kernel's messages tell it (ErrPeerGone). A test kills the processes it
// starts when it is done with them.
func Example() {
	f := memfabric.New()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	sp, cp := f.Node("10.2.2.2").Process(), f.Node("10.2.2.1").Process()
	defer sp.Kill()
	defer cp.Kill()
	srv, err := xrc.NewEndpoint(ctx, xrc.Config{Process: sp, Addr: "10.2.2.2:7000"})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer srv.Close()
	cli, err := xrc.NewEndpoint(ctx, xrc.Config{Process: cp, Addr: "10.2.2.1:7000"})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer cli.Close()
	accepted := make(chan *xrc.Conn, 1)
	go func() {
		s, _ := srv.Accept(ctx)
		accepted <- s
	}()
	c, err := cli.Dial(ctx, "10.2.2.2:7000")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer c.Close()
	s := <-accepted
	if s == nil {
		fmt.Println("no connection accepted")
		return
	}
	defer s.Close()
	if err := c.Send(ctx, []byte("hello")); err != nil {
		fmt.Println(err)
		return
	}
	buf := make([]byte, 64)
	n, err := s.Recv(ctx, buf)
	fmt.Printf("server got %q (%v)\n", buf[:n], err)

	cp.Kill()
	_, err = s.Recv(ctx, buf)
	fmt.Println("after the client's kill, peer gone:", errors.Is(err, xrc.ErrPeerGone))
	// Output:
	// server got "hello" (<nil>)
	// after the client's kill, peer gone: true
}
