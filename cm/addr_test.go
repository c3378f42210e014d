package cm

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/goxrc/goxrc/internal/fakedns"
)

func TestResolveAddrs(t *testing.T) {
	ctx := ctxT(t)
	for in, want := range map[string]string{
		"10.0.0.1:7471":       "10.0.0.1:7471",
		"[::ffff:10.0.0.1]:1": "10.0.0.1:1",
		"[fe80::1%lo]:7471":   "[fe80::1%lo]:7471",
		// An interface index as the name, the CM's form (it was kept,
		// and RemoteAddr and LocalAddr then differed in form).
		"[fe80::1%1]:7471": "[fe80::1%lo]:7471",
		":7471":            "0.0.0.0:7471",
		// A service name, as net.Dial takes (it was refused).
		"10.0.0.1:http": "10.0.0.1:80",
	} {
		as, err := resolveAddrs(ctx, nil, "ip", in)
		require.NoError(t, err, in)
		require.Equal(t, []netip.AddrPort{netip.MustParseAddrPort(want)}, as, in)
	}
	as, err := resolveAddrs(ctx, nil, "ip", "localhost:7471")
	require.NoError(t, err)
	require.NotEmpty(t, as)
	for _, a := range as {
		require.True(t, a.Addr().IsLoopback() && a.Port() == 7471, "%v", a)
	}
	for _, bad := range []string{"10.0.0.1", "10.0.0.1:port", "10.0.0.1:70000"} {
		_, err := resolveAddrs(ctx, nil, "ip", bad)
		require.Error(t, err, bad)
	}
}

// A name's addresses are dialed in turn, each with a share of the time
// left, until one connects; with none, the first error is the answer.
func TestDialEachTriesAddressesInTurn(t *testing.T) {
	addrs := []netip.AddrPort{
		netip.MustParseAddrPort("[fd00::1]:1"), netip.MustParseAddrPort("10.0.0.1:1"), netip.MustParseAddrPort("10.0.0.2:1"),
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var tried []netip.AddrPort
	var shares []time.Duration
	want := &Conn{}
	c, err := dialEach(ctx, addrs, func(ctx context.Context, a netip.AddrPort) (*Conn, error) {
		tried = append(tried, a)
		dl, _ := ctx.Deadline()
		shares = append(shares, time.Until(dl))
		if a == addrs[1] {
			return want, nil
		}
		return nil, errors.New("unreachable " + a.String())
	})
	require.NoError(t, err)
	require.Same(t, want, c)
	require.Equal(t, addrs[:2], tried, "stops at the first that connects")
	require.InDelta(t, 10*time.Second, shares[0], float64(time.Second), "a third of the time for the first of three")
	require.InDelta(t, 15*time.Second, shares[1], float64(time.Second), "half of what is left for the second of three")

	tried = nil
	_, err = dialEach(ctx, addrs, func(ctx context.Context, a netip.AddrPort) (*Conn, error) {
		tried = append(tried, a)
		return nil, errors.New("unreachable " + a.String())
	})
	require.EqualError(t, err, "unreachable [fd00::1]:1", "the first address's error")
	require.Equal(t, addrs, tried)

	// Little time left: each gets at least minDialShare of it; a
	// cancelled context stops the turns.
	short, cancelShort := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancelShort()
	tried = nil
	_, err = dialEach(short, addrs, func(ctx context.Context, a netip.AddrPort) (*Conn, error) {
		tried = append(tried, a)
		dl, _ := ctx.Deadline()
		require.InDelta(t, minDialShare, time.Until(dl), float64(200*time.Millisecond))
		cancelShort()
		return nil, ctx.Err()
	})
	require.Error(t, err)
	require.Len(t, tried, 1)
}

// WithResolver's names are what Listen and Dial look up; a name whose
// first address has no listener connects to the next, and the failure is
// logged. On the in-memory fabric here; TestCMDialTriesEachAddressOfAName
// does it over soft-RoCE in the VM.
func TestNamesResolvedByWithResolver(t *testing.T) {
	ctx := ctxT(t)
	f := newFabric(t)
	server, client := f.Node("10.1.0.1"), f.Node("10.1.0.2")
	r := fakedns.Resolver(map[string][]netip.Addr{
		"server.test": {netip.MustParseAddr("10.1.0.1")},
		"svc.test":    {netip.MustParseAddr("10.1.0.9"), netip.MustParseAddr("10.1.0.1")},
		"none.test":   {netip.MustParseAddr("10.1.0.9"), netip.MustParseAddr("10.1.0.8")},
	})
	domain := func() Option { return WithDomainPath(filepath.Join(t.TempDir(), "xrc")) }

	l, err := Listen(ctx, "server.test:7471", WithFabric(server.Process()), WithResolver(r), domain())
	require.NoError(t, err)
	defer l.Close()
	require.Equal(t, "10.1.0.1:7471", l.Addr().String())
	go func() {
		for {
			c, err := l.Accept(ctx)
			if err != nil {
				return
			}
			c.Send(ctx, []byte("hello"))
			c.Close()
		}
	}()

	var log bytes.Buffer
	c, err := Dial(ctx, "svc.test:7471", WithFabric(client.Process()), WithResolver(r), domain(),
		WithLogger(slog.New(slog.NewTextHandler(&log, nil))))
	require.NoError(t, err)
	defer c.Close()
	require.Equal(t, "10.1.0.1:7471", c.RemoteAddr().String())
	buf := make([]byte, 16)
	n, err := c.Recv(ctx, buf)
	require.NoError(t, err)
	require.Equal(t, "hello", string(buf[:n]))
	require.Contains(t, log.String(), `msg="dial: an address of the name failed" name=svc.test:7471 addr=10.1.0.9:7471`)

	_, err = Dial(ctx, "none.test:7471", WithFabric(client.Process()), WithResolver(r), domain())
	require.ErrorContains(t, err, "10.1.0.9:7471", "the first address's error")

	_, err = Dial(ctx, "unknown.test:7471", WithFabric(client.Process()), WithResolver(r), domain())
	var dnsErr *net.DNSError
	require.ErrorAs(t, err, &dnsErr)
	require.True(t, dnsErr.IsNotFound)
}

// WithLocalAddr on the fabric: the node's own address works, and keeps a
// name's addresses to its family (a name with only an IPv6 address has no
// suitable address, as with net.Dialer); any other address, one that does
// not parse, or a family the dial cannot use fails with a clear error.
func TestWithLocalAddr(t *testing.T) {
	ctx := ctxT(t)
	f := newFabric(t)
	server, client := f.Node("10.1.0.1"), f.Node("10.1.0.2")
	r := fakedns.Resolver(map[string][]netip.Addr{
		"dual.test": {netip.MustParseAddr("fd00::1"), netip.MustParseAddr("10.1.0.1")},
		"six.test":  {netip.MustParseAddr("fd00::1")},
	})
	domain := func() Option { return WithDomainPath(filepath.Join(t.TempDir(), "xrc")) }
	l, err := Listen(ctx, "10.1.0.1:7471", WithFabric(server.Process()), domain(), WithLocalAddr("10.9.9.9"))
	require.NoError(t, err, "Listen ignores WithLocalAddr")
	defer l.Close()
	_, err = Listen(ctx, "10.1.0.1:7472", WithFabric(server.Process()), domain(), WithLocalAddr("10.9.9"))
	require.ErrorIs(t, err, ErrInvalid, "but checks that it parses")
	go func() {
		for {
			c, err := l.Accept(ctx)
			if err != nil {
				return
			}
			c.Send(ctx, []byte(c.RemoteAddr().(Addr).Addr().String()))
			c.Close()
		}
	}()
	dial := func(address string, opts ...Option) (*Conn, error) {
		return Dial(ctx, address, append(opts, WithFabric(client.Process()), WithResolver(r), domain())...)
	}

	for _, local := range []string{"10.1.0.2", "::ffff:10.1.0.2", "0.0.0.0"} {
		c, err := dial("dual.test:7471", WithLocalAddr(local))
		require.NoError(t, err, local)
		buf := make([]byte, 64)
		n, err := c.Recv(ctx, buf)
		require.NoError(t, err, local)
		require.Equal(t, "10.1.0.2", string(buf[:n]), "the address the listener saw, from %s", local)
		require.Equal(t, "10.1.0.1:7471", c.RemoteAddr().String())
		require.NoError(t, c.Close())
	}
	_, err = dial("six.test:7471", WithLocalAddr("10.1.0.2"))
	var sixErr *net.AddrError
	require.ErrorAs(t, err, &sixErr)
	require.Equal(t, "no suitable address found", sixErr.Err, "%v", err)

	_, err = dial("10.1.0.1:7471", WithLocalAddr("10.1.0.3"))
	require.ErrorContains(t, err, "local address 10.1.0.3 is not the fabric node's (10.1.0.2)")
	require.ErrorIs(t, err, syscall.EADDRNOTAVAIL)
	_, err = dial("10.1.0.1:7471", WithLocalAddr("10.1.0"))
	require.ErrorContains(t, err, `local address: ParseAddr("10.1.0")`)
	require.ErrorIs(t, err, ErrInvalid)
	_, err = dial("10.1.0.1:", WithLocalAddr("10.1.0.2"))
	var portErr *net.AddrError
	require.ErrorAs(t, err, &portErr, "no port, as package net says it")
	require.Equal(t, "missing port in address", portErr.Err)
	var ae *net.AddrError
	_, err = dial("[fd00::1]:7471", WithLocalAddr("10.1.0.2"))
	require.ErrorAs(t, err, &ae)
	require.Equal(t, "no suitable address found", ae.Err)
	d := Dialer{Options: []Option{WithFabric(client.Process()), domain(), WithLocalAddr("10.1.0.2")}}
	_, err = d.DialContext(ctx, "tcp6", "dual.test:7471")
	require.ErrorAs(t, err, &ae)
	require.Equal(t, "mismatched local address type", ae.Err)
	require.Equal(t, "10.1.0.2", ae.Addr)
}

// resolveAddrs keeps to the family asked for, as net.Dial does for "tcp4"
// and "tcp6".
func TestResolveAddrsFamilies(t *testing.T) {
	ctx := ctxT(t)
	v4, v6 := netip.MustParseAddr("192.0.2.1"), netip.MustParseAddr("2001:db8::1")
	r := fakedns.Resolver(map[string][]netip.Addr{"both.test": {v4, v6}, "four.test": {v4}})
	for _, c := range []struct {
		family, address string
		want            []string
	}{
		{"ip", "both.test:1", []string{"192.0.2.1:1", "[2001:db8::1]:1"}},
		{"ip4", "both.test:1", []string{"192.0.2.1:1"}},
		{"ip6", "both.test:1", []string{"[2001:db8::1]:1"}},
		{"ip4", "[::ffff:192.0.2.1]:1", []string{"192.0.2.1:1"}},
		{"ip6", ":1", []string{"[::]:1"}},
		{"ip4", ":1", []string{"0.0.0.0:1"}},
	} {
		as, err := resolveAddrs(ctx, r, c.family, c.address)
		require.NoError(t, err, "%s %s", c.family, c.address)
		var got []string
		for _, a := range as {
			got = append(got, a.String())
		}
		require.ElementsMatch(t, c.want, got, "%s %s", c.family, c.address)
	}
	// A name without an address of the family is not found, as with
	// net.Dial; a literal of the other family is no suitable address.
	_, err := resolveAddrs(ctx, r, "ip6", "four.test:1")
	var dnsErr *net.DNSError
	require.ErrorAs(t, err, &dnsErr)
	require.True(t, dnsErr.IsNotFound, "%v", err)
	for _, c := range [][2]string{{"ip4", "[2001:db8::1]:1"}, {"ip6", "192.0.2.1:1"}} {
		_, err := resolveAddrs(ctx, r, c[0], c[1])
		var ae *net.AddrError
		require.ErrorAs(t, err, &ae, "%s %s", c[0], c[1])
		require.Equal(t, "no suitable address found", ae.Err)
	}
}

// A Dialer's DialContext is what net/http's Transport takes: a net.Conn
// for "tcp" addresses, an error for networks it does not serve.
func TestDialerDialContext(t *testing.T) {
	ctx := ctxT(t)
	f := newFabric(t)
	server, client := f.Node("10.1.0.1"), f.Node("10.1.0.2")
	r := fakedns.Resolver(map[string][]netip.Addr{"server.test": {netip.MustParseAddr("10.1.0.1")}})
	l, err := Listen(ctx, "10.1.0.1:7471", WithFabric(server.Process()), WithDomainPath(filepath.Join(t.TempDir(), "xrc")))
	require.NoError(t, err)
	defer l.Close()
	go func() {
		c, err := l.Accept(ctx)
		if err != nil {
			return
		}
		nc := c.NetConn()
		io.Copy(nc, nc)
		nc.Close()
	}()

	d := &Dialer{Options: []Option{WithFabric(client.Process()), WithResolver(r), WithDomainPath(filepath.Join(t.TempDir(), "xrc"))}}
	nc, err := d.DialContext(ctx, "tcp", "server.test:7471")
	require.NoError(t, err)
	defer nc.Close()
	require.Equal(t, "10.1.0.1:7471", nc.RemoteAddr().String())
	_, err = nc.Write([]byte("echo me"))
	require.NoError(t, err)
	buf := make([]byte, 7)
	_, err = io.ReadFull(nc, buf)
	require.NoError(t, err)
	require.Equal(t, "echo me", string(buf))

	_, err = d.DialContext(ctx, "udp", "server.test:7471")
	require.ErrorAs(t, err, new(net.UnknownNetworkError))
	_, err = d.DialContext(ctx, "tcp6", "server.test:7471")
	require.ErrorContains(t, err, "dial server.test:7471: lookup server.test", "an IPv4-only name")
	_, err = d.DialContext(ctx, "tcp6", "10.1.0.1:7471")
	require.EqualError(t, err, "dial 10.1.0.1:7471: address 10.1.0.1: no suitable address found")
}

// A name's IPv4-mapped answers (AAAA records holding ::ffff:a.b.c.d) are
// IPv4 addresses, as for net.Dial: unmapped, merged with the same address
// in an A record, kept for "ip4" and not for "ip6".
func TestResolveAddrsMappedAnswers(t *testing.T) {
	ctx := ctxT(t)
	r := fakedns.Resolver(map[string][]netip.Addr{
		"mapped.test": {netip.MustParseAddr("::ffff:192.0.2.1")},
		"dup.test":    {netip.MustParseAddr("192.0.2.1"), netip.MustParseAddr("::ffff:192.0.2.1")},
	})
	for _, name := range []string{"mapped.test:1", "dup.test:1"} {
		as, err := resolveAddrs(ctx, r, "ip", name)
		require.NoError(t, err, name)
		require.Equal(t, []netip.AddrPort{netip.MustParseAddrPort("192.0.2.1:1")}, as, name)
	}
	_, err := resolveAddrs(ctx, r, "ip6", "mapped.test:1")
	var ae *net.AddrError
	require.ErrorAs(t, err, &ae)
	require.Equal(t, "no suitable address found", ae.Err)
}
