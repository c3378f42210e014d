package cm_test

import (
	"context"
	"fmt"
	"time"

	"github.com/goxrc/goxrc/cm"
)

// An echo exchange over RDMA. Without an RDMA device (as on most build
// machines) Listen fails, and the example says so.
func Example() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	l, err := cm.Listen(ctx, "10.77.0.1:0")
	if err != nil {
		fmt.Println("no RDMA here")
		return
	}
	defer l.Close()
	go func() {
		c, err := l.Accept(ctx)
		if err != nil {
			return
		}
		defer c.Close()
		buf := make([]byte, c.MaxMessageSize())
		n, _ := c.Recv(ctx, buf)
		c.Send(ctx, buf[:n])
	}()
	c, err := cm.Dial(ctx, l.Addr().String())
	if err != nil {
		fmt.Println(err)
		return
	}
	defer c.Close()
	c.Send(ctx, []byte("hello"))
	buf := make([]byte, 64)
	n, _ := c.Recv(ctx, buf)
	fmt.Println(string(buf[:n]))
}
