package cm

import (
	"context"
	"fmt"
	"net"
)

// A Dialer dials RDMA connections with a fixed set of options and returns
// them as net.Conns (Conn.NetConn). Its DialContext has net.Dialer's
// signature, which net/http's Transport takes as it is, so that HTTP runs
// over RDMA unchanged (the server side serves Listener.NetListener):
//
//	d := &cm.Dialer{Options: []cm.Option{cm.WithMessageSize(16384)}}
//	client := &http.Client{Transport: &http.Transport{DialContext: d.DialContext}}
//	resp, err := client.Get("http://10.77.0.1:7471/")
//
// gRPC's WithContextDialer takes it through a closure that passes "tcp".
// Dial gives the *Conn itself, with the same options, for messages.
type Dialer struct {
	// Options apply to every connection the Dialer makes.
	Options []Option
}

// DialContext dials address ("host:port") as Dial does and returns the
// connection's NetConn. network is "tcp", "tcp4" or "tcp6", whose address
// families it keeps to as net.Dial does, or "rdma" (either family).
func (d *Dialer) DialContext(ctx context.Context, network, address string) (net.Conn, error) {
	family := "ip"
	switch network {
	case "tcp", "rdma":
	case "tcp4":
		family = "ip4"
	case "tcp6":
		family = "ip6"
	default:
		// An argument the call cannot take: ErrInvalid, as its doc says.
		globalStats.dialErrors.Add(1)
		return nil, opError("dial", nil, fmt.Errorf("%w (%w)", net.UnknownNetworkError(network), ErrInvalid))
	}
	c, err := dialFamily(ctx, family, address, d.Options)
	if err != nil {
		return nil, err
	}
	return c.NetConn(), nil
}

// Dial dials address as the package's Dial does, with the Dialer's
// options, and returns the message connection.
func (d *Dialer) Dial(ctx context.Context, address string) (*Conn, error) {
	return Dial(ctx, address, d.Options...)
}
