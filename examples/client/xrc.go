package main

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/goxrc/goxrc/cm"
	"github.com/goxrc/goxrc/xrc/memfabric"
)

// xrcDemo connects client processes to server processes with XRC and shows
// the queue pairs each node holds against what RC would need.
//
// With -fabric everything runs on an in-memory fabric in this one program:
// -nodes server nodes with -procs server processes each (all of a node's
// processes share its XRC domain, each listens on its own port) and one
// client node with -clients client processes, each dialing every server.
// Without it, it dials the servers in -addr (comma-separated) on the real
// device with XRC preferred and prints the transport each connection got:
// on a device without XRC (soft-RoCE), RC, and the log says why.
func xrcDemo(ctx context.Context, o options) (r result, err error) {
	r = result{Mode: "xrc", Addr: o.addr, Size: o.size}
	start := time.Now()
	defer func() { r.Seconds = time.Since(start).Seconds() }()
	out := o.text()
	sized := []cm.Option{cm.WithMessageSize(max(o.size, 64)), cm.WithQueueDepth(o.depth)}
	if !o.fabric {
		text := slog.NewTextHandler(out, &slog.HandlerOptions{Level: slog.LevelInfo})
		addrs := strings.Split(o.addr, ",")
		p := newProgress(o.progress, "xrc", len(addrs))
		defer p.stop()
		for _, a := range addrs {
			var reason string
			logger := slog.New(reasonHandler{text, &reason})
			c, err := dial(ctx, a, o.dialOptions(append(sized, cm.WithXRC(cm.XRCPrefer), cm.WithLogger(logger),
				cm.WithBusyPoll(o.busyPoll))...)...)
			if err != nil {
				return r, err
			}
			fmt.Fprintf(out, "%s: connected over %v\n", a, c.Transport())
			row := connRow{Addr: a, Transport: c.Transport().String()}
			if c.Transport() == cm.TransportRC {
				row.Reason = reason
			}
			r.Conns = append(r.Conns, row)
			err = greet(ctx, c, "echo") // examples/server's echo mode
			if err == nil {
				err = exchange(ctx, c, "hello over whatever the device allows", o.size)
			}
			c.Close()
			if err != nil {
				return r, closedEarly(err, a, 0, 1)
			}
			r.Count++
			p.add(1)
		}
		return r, nil
	}

	r.Addr = "" // the fabric's servers are on their own addresses
	f := memfabric.New()
	tmp, err := os.MkdirTemp("", "goxrc-demo-")
	if err != nil {
		return r, err
	}
	defer os.RemoveAll(tmp)
	var addrs []string
	var servers []*memfabric.Node
	var wg sync.WaitGroup
	defer wg.Wait()
	for n := 0; n < o.nodes; n++ {
		node := f.Node(fmt.Sprintf("10.9.0.%d", n+1))
		servers = append(servers, node)
		domain := filepath.Join(tmp, fmt.Sprintf("node%d", n))
		for p := 0; p < o.procs; p++ {
			l, err := cm.Listen(ctx, node.Addr().String()+":0", append(sized, cm.WithFabric(node.Process()), cm.WithDomainPath(domain))...)
			if err != nil {
				return r, err
			}
			defer l.Close()
			addrs = append(addrs, l.Addr().String())
			wg.Add(1)
			go func() { defer wg.Done(); serveEcho(ctx, l, o.clients) }()
		}
	}
	clientNode := f.Node("10.9.1.1")
	clientDomain := filepath.Join(tmp, "client")
	var conns []*cm.Conn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	p := newProgress(o.progress, "xrc", o.clients*len(addrs))
	defer p.stop()
	for i := 0; i < o.clients; i++ {
		proc := clientNode.Process()
		for _, a := range addrs {
			c, err := cm.Dial(ctx, a, append(sized, cm.WithFabric(proc), cm.WithDomainPath(clientDomain))...)
			if err != nil {
				return r, err
			}
			conns = append(conns, c)
			if err := exchange(ctx, c, fmt.Sprintf("client %d to %s", i, a), o.size); err != nil {
				return r, err
			}
			r.Count++
			p.add(1)
		}
	}
	p.stop()
	fmt.Fprintf(out, "%d client processes on one node, %d server nodes with %d processes each: %d connections, all echoed (%d bytes each way)\n",
		o.clients, o.nodes, o.procs, len(conns), o.size)
	fmt.Fprintf(out, "%-10s %5s %5s %12s %9s %21s\n", "node", "INIs", "TGTs", "TGT handles", "XRC QPs", "RC would need (QPs)")
	show := func(name string, s memfabric.NodeStats, rc int) {
		row := qpRow{Node: name, INIs: s.INIs, TGTs: s.TGTs, TGTHandles: s.TGTHandles, XRCQPs: s.QPs(), RCQPs: rc}
		r.Nodes = append(r.Nodes, row)
		fmt.Fprintf(out, "%-10s %5d %5d %12d %9d %21d\n", row.Node, row.INIs, row.TGTs, row.TGTHandles, row.XRCQPs, row.RCQPs)
	}
	show("client", clientNode.Stats(), o.clients*o.nodes*o.procs)
	for i, n := range servers {
		show(fmt.Sprintf("server%d", i), n.Stats(), o.clients*o.procs)
	}
	return r, nil
}

// reasonHandler passes the records of a Dial's log on to its Handler, and
// keeps the reason of the last that gives one: cm's "XRC unavailable, using
// RC" line, where an XRCPrefer Dial goes on over RC.
type reasonHandler struct {
	slog.Handler
	reason *string
}

func (h reasonHandler) Handle(ctx context.Context, r slog.Record) error {
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == "reason" {
			*h.reason = a.Value.String()
		}
		return true
	})
	return h.Handler.Handle(ctx, r)
}

// exchange sends a message of size bytes, label cut or padded to it, and
// checks its echo.
func exchange(ctx context.Context, c *cm.Conn, label string, size int) error {
	msg := make([]byte, size)
	for i := copy(msg, label); i < size; i++ {
		msg[i] = byte(i)
	}
	if err := c.Send(ctx, msg); err != nil {
		return err
	}
	buf := make([]byte, size+64)
	n, err := c.Recv(ctx, buf)
	if err != nil {
		return err
	}
	if !bytes.Equal(buf[:n], msg) {
		return fmt.Errorf("%s: echo of %d bytes differs from the %d sent", label, n, size)
	}
	return nil
}

// serveEcho accepts n connections and echoes on each until it closes.
func serveEcho(ctx context.Context, l *cm.Listener, n int) {
	for i := 0; i < n; i++ {
		c, err := l.Accept(ctx)
		if err != nil {
			return
		}
		go func() {
			defer c.Close()
			buf := make([]byte, c.MaxRecvSize())
			for {
				k, err := c.Recv(ctx, buf)
				if err != nil || c.Send(ctx, buf[:k]) != nil {
					return
				}
			}
		}()
	}
}
