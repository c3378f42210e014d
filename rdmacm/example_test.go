package rdmacm_test

import (
	"context"
	"fmt"
	"net/netip"
	"time"

	"github.com/goxrc/goxrc/rdmacm"
	"github.com/goxrc/goxrc/verbs"
)

// A CM exchange with made-up QP numbers: a listener and a client on one
// node, private data both ways. It needs an RDMA device holding 10.77.0.1
// (the test VM's rxe0), so it is compiled here, not run.
func Example() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ch, err := rdmacm.NewEventChannel()
	if err != nil {
		fmt.Println("no RDMA CM here:", err)
		return
	}
	defer ch.Close()
	addr := netip.MustParseAddrPort("10.77.0.1:18515")

	l, err := ch.CreateID(rdmacm.PortSpaceTCP, verbs.QPTypeRC)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer l.Close()
	if err := l.Bind(addr); err != nil {
		fmt.Println(err)
		return
	}
	if err := l.Listen(8); err != nil {
		fmt.Println(err)
		return
	}

	c, err := ch.CreateID(rdmacm.PortSpaceTCP, verbs.QPTypeRC)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer c.Close()
	if err := c.ResolveAddr(ctx, netip.AddrPort{}, addr); err != nil {
		fmt.Println(err)
		return
	}
	if err := c.ResolveRoute(ctx); err != nil {
		fmt.Println(err)
		return
	}
	if err := c.Connect(rdmacm.ConnParam{QPNum: 0x123456, PrivateData: []byte("hello"), RetryCount: 7, RNRRetryCount: 7}); err != nil {
		fmt.Println(err)
		return
	}

	req, err := l.WaitEvent(ctx, rdmacm.EventConnectRequest)
	if err != nil {
		fmt.Println(err)
		return
	}
	srv := req.ID // ours now
	defer srv.Close()
	if err := srv.Accept(rdmacm.ConnParam{QPNum: 0x654321, PrivateData: []byte("welcome")}); err != nil {
		fmt.Println(err)
		return
	}

	resp, err := c.WaitEvent(ctx, rdmacm.EventConnectResponse)
	if err != nil {
		fmt.Println(err)
		return
	}
	if err := c.Establish(); err != nil {
		fmt.Println(err)
		return
	}
	if _, err := srv.WaitEvent(ctx, rdmacm.EventEstablished); err != nil {
		fmt.Println(err)
		return
	}
	fmt.Printf("peer QP %#x, %d bytes of private data\n", resp.Conn.QPNum, len(resp.PrivateData))
}
