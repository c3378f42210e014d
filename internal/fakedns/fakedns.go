// Package fakedns is a DNS server inside a test: a *net.Resolver whose
// queries go to a table of names instead of the network, so that tests can
// give a name the addresses they need (several, unreachable ones first)
// without touching /etc/hosts or a real server. The queries run through
// the Go resolver's own code (PreferGo), framed as DNS over TCP on an
// in-memory pipe.
package fakedns

import (
	"context"
	"encoding/binary"
	"io"
	"net"
	"net/netip"
	"strings"

	"golang.org/x/net/dns/dnsmessage"
)

// Resolver returns a resolver that answers A and AAAA queries from names
// (keys without a trailing dot), each name's addresses in the given order
// (an IPv4-mapped address as an AAAA record, which a real server may
// hold), and NXDOMAIN for other names. The Go resolver sorts a name's addresses
// (RFC 6724) before it returns them, as it does for a real server's.
func Resolver(names map[string][]netip.Addr) *net.Resolver {
	return &net.Resolver{
		PreferGo: true,
		Dial: func(ctx context.Context, network, address string) (net.Conn, error) {
			client, server := net.Pipe()
			go serve(server, names)
			return client, nil
		},
	}
}

// serve answers the queries of one connection until the client closes it.
func serve(c net.Conn, names map[string][]netip.Addr) {
	defer c.Close()
	for {
		var n [2]byte
		if _, err := io.ReadFull(c, n[:]); err != nil {
			return
		}
		q := make([]byte, binary.BigEndian.Uint16(n[:]))
		if _, err := io.ReadFull(c, q); err != nil {
			return
		}
		a, err := answer(q, names)
		if err != nil {
			return
		}
		if _, err := c.Write(binary.BigEndian.AppendUint16(nil, uint16(len(a)))); err != nil {
			return
		}
		if _, err := c.Write(a); err != nil {
			return
		}
	}
}

// answer builds the response to the query message q.
func answer(q []byte, names map[string][]netip.Addr) ([]byte, error) {
	var p dnsmessage.Parser
	h, err := p.Start(q)
	if err != nil {
		return nil, err
	}
	question, err := p.Question()
	if err != nil {
		return nil, err
	}
	addrs, known := lookup(names, strings.TrimSuffix(question.Name.String(), "."))
	rh := dnsmessage.Header{ID: h.ID, Response: true, Authoritative: true, RecursionDesired: h.RecursionDesired, RecursionAvailable: true}
	if !known {
		rh.RCode = dnsmessage.RCodeNameError
	}
	b := dnsmessage.NewBuilder(nil, rh)
	b.EnableCompression()
	if err := b.StartQuestions(); err != nil {
		return nil, err
	}
	if err := b.Question(question); err != nil {
		return nil, err
	}
	if err := b.StartAnswers(); err != nil {
		return nil, err
	}
	for _, a := range addrs {
		rr := dnsmessage.ResourceHeader{Name: question.Name, Class: dnsmessage.ClassINET, TTL: 60}
		switch {
		case question.Type == dnsmessage.TypeA && a.Is4():
			err = b.AResource(rr, dnsmessage.AResource{A: a.As4()})
		case question.Type == dnsmessage.TypeAAAA && a.Is6():
			// An IPv4-mapped address too: an AAAA record may hold
			// one, and it was answered in neither query.
			err = b.AAAAResource(rr, dnsmessage.AAAAResource{AAAA: a.As16()})
		}
		if err != nil {
			return nil, err
		}
	}
	return b.Finish()
}

// lookup finds name in names as a DNS server does, whatever the case of
// its letters (RFC 4343).
func lookup(names map[string][]netip.Addr, name string) ([]netip.Addr, bool) {
	if addrs, ok := names[name]; ok {
		return addrs, true
	}
	for k, addrs := range names {
		if strings.EqualFold(k, name) {
			return addrs, true
		}
	}
	return nil, false
}
