// Command server is goxrc's example RDMA server. It accepts connections on
// an ip:port and serves each one in the mode its client asks for:
//
//   - echo: every message is sent back (ping-pong latency runs on this);
//   - sink: messages are counted and dropped, and a short report is sent
//     back after the last one (bandwidth runs on this).
//
// With -raw it speaks plain librdmacm messages and echoes them, which is
// what rdma-core's rdma_client example expects. Each connection's report
// counts what came after the mode request. The exit status is 1 if an
// Accept or a connection failed, a sink whose client ended before its N
// messages included, or one that broke, even if a Ctrl-C came the moment
// after; one that the shutdown ended did not fail. A client whose node
// vanishes is let go once a keepalive probe finds it gone (-keepalive); one
// that stays connected and silent is let go after -idle, if given, as asked:
// reported as closed by -idle ("idle": true with -json), not as failed.
// Ctrl-C (or SIGTERM) closes the listener and the connections, each
// reported as closed by the shutdown ("shutdown": true with -json), not as
// failed; a second Ctrl-C kills the server at once.
//
// With -raw, -keepalive and -xrc are refused: raw connections send no
// probes, and raw messages are plain sends on RC.
//
// With -xrc it prefers XRC: an XRC listener serves one device, so -addr
// must be that device's address (or -device name it). On a device with XRC
// it serves RC clients (those without -xrc, or on devices without XRC) on
// the same port too; on a device without XRC it logs why and serves RC.
//
//	server -addr 10.77.0.1:7471
//	server -addr 10.77.0.1:7471 -raw -count 1
//	server -addr 10.77.0.1:7472 -xrc
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"runtime/pprof"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/goxrc/goxrc/cm"
	"github.com/goxrc/goxrc/internal/interrupt"
)

func main() {
	addr := flag.String("addr", "0.0.0.0:7471", "ip:port to listen on")
	size := flag.Int("size", 64<<10, "largest message, bytes, 64 to 1 GiB (with -raw, 1 to 1 GiB)")
	depth := flag.Int("depth", 64, "receive queue depth, 2 to 4000")
	raw := flag.Bool("raw", false, "plain librdmacm messages (no goxrc framing); echo each one")
	count := flag.Int("count", 0, "exit after serving this many connections (0: run until interrupted)")
	idle := flag.Duration("idle", 0, "close a connection that sends nothing for this long (0: never)")
	keepalive := flag.Duration("keepalive", 10*time.Second, "probe an idle client this often, so one whose node vanished is let go (0: off; not with -raw)")
	asJSON := flag.Bool("json", false, "print one JSON object per connection served (not for one that closes without a request, as connect-mode dials do; the listening line goes to stderr)")
	verbose := flag.Bool("v", false, "log connection events")
	busyPoll := flag.Duration("busypoll", cm.DefaultBusyPoll, "how long a waiting call polls before sleeping")
	device := flag.String("device", "", "RDMA device to serve (e.g. rxe0); with an unspecified -addr, listen on its address only")
	preferXRC := flag.Bool("xrc", false, "prefer XRC; on a device without it, log why RC is used (an XRC listener serves one device: give a device's -addr or -device; not with -raw)")
	cpuProfile := flag.String("cpuprofile", "", "write a CPU profile of the run (until the server stops) to this file")
	flag.Parse()
	// Parsing stops at the first argument that is not a flag: the flags
	// after it would be dropped without a word (server 10.0.0.1:7471 -count 1).
	if flag.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "server: unexpected argument %q: every setting is a flag (-addr ip:port, ...)\n", flag.Arg(0))
		os.Exit(2)
	}
	if err := ignoredFlag(flag.CommandLine, *raw); err != nil {
		fmt.Fprintln(os.Stderr, "server:", err)
		os.Exit(2)
	}
	if *count < 0 || *idle < 0 || *keepalive < 0 || *busyPoll < 0 {
		fmt.Fprintln(os.Stderr, "server: -count, -idle, -keepalive and -busypoll must not be negative")
		os.Exit(2)
	}
	// cm's bounds (WithMessageSize, WithQueueDepth): Listen refused them
	// only after -cpuprofile's file was truncated, as a failed run.
	// Without -raw, 64 at least: a framed client's request ("sink N", up
	// to 24 bytes) and the sink's report (up to 39) are messages too,
	// bounded by -size as any other. Below 64 (the client's own floor) a
	// default bandwidth run against -size 8 failed its request ("message
	// too long: 9 bytes, limit 8"), and -size 16 failed the report after
	// the whole stream.
	least, why := minFramedSize, " without -raw (a client's request and the sink's report are messages too)"
	if *raw {
		least, why = 1, ""
	}
	if *size < least || *size > 1<<30 {
		fmt.Fprintf(os.Stderr, "server: -size %d: must be %d to %d%s\n", *size, least, 1<<30, why)
		os.Exit(2)
	}
	if *depth < 2 || *depth > 4000 {
		fmt.Fprintf(os.Stderr, "server: -depth %d: must be 2 to 4000\n", *depth)
		os.Exit(2)
	}
	// Refused before -cpuprofile's file is created, or truncated. The
	// port as Listen reads it: a number to 65535 or a service name.
	if _, port, err := net.SplitHostPort(*addr); err != nil || port == "" {
		fmt.Fprintf(os.Stderr, "server: -addr %q is not ip:port\n", *addr)
		os.Exit(2)
	} else if _, err := net.LookupPort("tcp", port); err != nil {
		fmt.Fprintf(os.Stderr, "server: -addr %q: bad port %q: %v\n", *addr, port, err)
		os.Exit(2)
	}
	if *preferXRC && *device == "" && unspecified(*addr) {
		fmt.Fprintln(os.Stderr, "server: -xrc: an XRC listener serves one device: give a device's address in -addr, or -device")
		os.Exit(2)
	}
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err == nil {
			err = pprof.StartCPUProfile(f)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "server:", err)
			os.Exit(1)
		}
		defer pprof.StopCPUProfile()
	}

	level := slog.LevelWarn
	if *preferXRC {
		level = slog.LevelInfo
	}
	if *verbose {
		level = slog.LevelDebug
	}
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	opts := []cm.Option{cm.WithMessageSize(*size), cm.WithQueueDepth(*depth), cm.WithLogger(logger), cm.WithBusyPoll(*busyPoll), cm.WithKeepalive(*keepalive)}
	if *raw {
		opts = append(opts, cm.WithRawMessages())
	}
	if *device != "" {
		opts = append(opts, cm.WithDevice(*device))
	}
	if *preferXRC {
		opts = append(opts, cm.WithXRC(cm.XRCPrefer))
	}
	ctx, stop := interrupt.Context()
	defer stop()
	l, err := listen(ctx, *addr, opts...)
	if err != nil {
		fmt.Fprintln(os.Stderr, "server:", err)
		os.Exit(1)
	}
	defer l.Close()
	// The sign that it listens, and where (-addr ip:0 picks a port): on
	// stderr with -json, whose stdout is the connections' reports.
	text := os.Stdout
	if *asJSON {
		text = os.Stderr
	}
	fmt.Fprintf(text, "listening on %s (message size %d, queue depth %d, raw %v)\n", l.Addr(), *size, *depth, *raw)
	if serveConns(ctx, l, *count, *raw, *idle, *asJSON) {
		pprof.StopCPUProfile()
		os.Exit(1)
	}
}

// minFramedSize is the least -size without -raw: the client's floor
// (examples/client dials with at least 64-byte messages), which holds its
// mode request and the sink's report.
const minFramedSize = 64

// listen is cm.Listen; the tests listen on an in-memory fabric.
var listen = cm.Listen

// serveConn is serve; a test ends the context just after a connection's
// end, as a Ctrl-C can.
var serveConn = serve

// serveConns accepts connections on l and serves each, count of them (0:
// until ctx ends). It reports whether an Accept or a connection failed
// (ended by the shutdown, ctx's end, is not failed).
func serveConns(ctx context.Context, l *cm.Listener, count int, raw bool, idle time.Duration, asJSON bool) bool {
	var wg sync.WaitGroup
	var failed atomic.Bool // exit status 1: an Accept or a connection failed (not by the shutdown)
	for served := 0; count == 0 || served < count; served++ {
		c, err := l.Accept(ctx)
		if err != nil {
			if !errors.Is(err, ctx.Err()) { // not the shutdown's end (nil: none)
				fmt.Fprintln(os.Stderr, "server:", err)
				failed.Store(true)
			}
			break
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := serveConn(ctx, c, raw, idle)
			// serve clears the error of a connection the shutdown
			// ended, and only its: one that failed failed, even if
			// its report comes after a Ctrl-C.
			if r.Error != "" {
				failed.Store(true)
			}
			if r.Mode != "?" || r.Error != "" || r.Shutdown || r.Idle {
				report(r, idle, asJSON)
			}
		}()
	}
	// The listener completes handshakes before Accept: open past the
	// count, it would connect clients that nothing serves.
	l.Close()
	wg.Wait()
	return failed.Load()
}

// framedOnly lists the flags that only framed connections (those without
// -raw) use, and why; every other flag is used with and without -raw.
// Given with -raw, they are refused: the server ran as if they were not
// given (-keepalive without a word, -xrc with a log line).
var framedOnly = map[string]string{
	"keepalive": "raw connections send no probes",
	"xrc":       "raw messages are plain sends on RC",
}

// ignoredFlag refuses a flag given in fs that a -raw server does not use.
func ignoredFlag(fs *flag.FlagSet, raw bool) error {
	var err error
	fs.Visit(func(f *flag.Flag) {
		// A boolean set false (-xrc=false) asks for nothing to be ignored,
		// as the client's -raw=false and -fabric=false.
		if b, ok := f.Value.(interface{ IsBoolFlag() bool }); ok && b.IsBoolFlag() && f.Value.String() == "false" {
			return
		}
		if why, ok := framedOnly[f.Name]; ok && raw && err == nil {
			err = fmt.Errorf("-%s has no effect with -raw: %s", f.Name, why)
		}
	})
	return err
}

type result struct {
	Remote   string  `json:"remote"`
	Mode     string  `json:"mode"`
	Messages uint64  `json:"messages"`
	Bytes    uint64  `json:"bytes"`
	Seconds  float64 `json:"seconds"`
	Error    string  `json:"error,omitempty"`
	// Shutdown: the server's shutdown (Ctrl-C) ended the connection.
	Shutdown bool `json:"shutdown,omitempty"`
	// Idle: the server closed the connection after -idle with nothing
	// received, as the user asked: no failure.
	Idle bool `json:"idle,omitempty"`
}

// serve serves c in the mode its client asks for; with idle > 0 it closes c
// once nothing has come for that long.
func serve(ctx context.Context, c *cm.Conn, raw bool, idle time.Duration) result {
	defer c.Close()
	r := result{Remote: c.RemoteAddr().String(), Mode: "echo"}
	start := time.Now()
	var idled atomic.Bool
	stop, stopped := make(chan struct{}), make(chan struct{})
	if idle > 0 {
		go func() { watchIdle(c, idle, stop, &idled); close(stopped) }()
	} else {
		close(stopped)
	}
	buf := make([]byte, c.MaxRecvSize())
	var err error
	request := -1 // the mode request's bytes: not counted (-1: none came)
	if raw {
		err = echo(ctx, c, buf)
	} else {
		r.Mode, request, err = handle(ctx, c, buf)
	}
	close(stop)
	<-stopped // idled is final: the watchdog may not close c after a clean end
	st := c.Stats()
	r.Messages, r.Bytes, r.Seconds = st.MessagesReceived, st.BytesReceived, time.Since(start).Seconds()
	if request >= 0 { // an empty request is a message too
		r.Messages--
		r.Bytes -= uint64(request)
	}
	// A raw peer has no graceful close: its disconnect is the end.
	if err != nil && !errors.Is(err, io.EOF) && !(raw && errors.Is(err, cm.ErrPeerGone)) {
		r.Error = err.Error()
	}
	if ctx.Err() != nil && errors.Is(err, ctx.Err()) {
		// Recv answers an ended context before a failure: one that
		// broke c first is no shutdown's doing (Stats says so).
		if st.Errors == 0 {
			r.Error, r.Shutdown = "", true // the user asked for it: no failure
		} else {
			r.Error = "the connection broke before the shutdown"
		}
	}
	if r.Mode == "?" && errors.Is(err, io.EOF) {
		r.Error = "" // connected and closed without a request, as a connect benchmark does
	}
	// The watchdog's own Close, not a failure that came before it (Recv
	// reports that one) nor a clean end.
	if idled.Load() && errors.Is(err, cm.ErrClosed) {
		r.Error, r.Idle = "", true
	}
	return r
}

// watchIdle closes c, and sets idled, once it has received nothing for
// idle; it looks at c's counters (the data path keeps no timer) until stop.
func watchIdle(c *cm.Conn, idle time.Duration, stop <-chan struct{}, idled *atomic.Bool) {
	tick := time.NewTicker(max(idle/8, time.Millisecond))
	defer tick.Stop()
	last, since := c.Stats().MessagesReceived, time.Now()
	for {
		select {
		case <-stop:
			return
		case now := <-tick.C:
			if n := c.Stats().MessagesReceived; n != last {
				last, since = n, now
			} else if now.Sub(since) >= idle {
				idled.Store(true)
				c.Close()
				return
			}
		}
	}
}

// handle reads the client's first message, "echo" or "sink N", and serves
// it. It returns the mode and the request's length (-1 if none came).
func handle(ctx context.Context, c *cm.Conn, buf []byte) (string, int, error) {
	n, err := c.Recv(ctx, buf)
	if err != nil {
		return "?", -1, err
	}
	req := buf[:n]
	switch {
	case string(req) == "echo":
		return "echo", n, echo(ctx, c, buf)
	case bytes.HasPrefix(req, []byte("sink ")):
		total, ok := sinkCount(req[len("sink "):])
		if !ok {
			return "sink", n, fmt.Errorf("bad sink count %q", req[len("sink "):min(n, 32)])
		}
		return "sink", n, sink(ctx, c, buf, total)
	}
	return "?", n, fmt.Errorf("unknown mode %q", buf[:min(n, 32)])
}

// sinkCount reads a sink request's N: decimal digits, no sign and no
// leading zero (strconv.ParseInt takes both), at most an int64, a 64-bit
// client's count.
func sinkCount(b []byte) (int64, bool) {
	if len(b) == 0 || len(b) > 1 && b[0] == '0' {
		return 0, false
	}
	for _, d := range b {
		if d < '0' || d > '9' {
			return 0, false
		}
	}
	n, err := strconv.ParseInt(string(b), 10, 64)
	return n, err == nil
}

func echo(ctx context.Context, c *cm.Conn, buf []byte) error {
	for {
		n, err := c.Recv(ctx, buf)
		if err != nil {
			return err
		}
		if err := c.Send(ctx, buf[:n]); err != nil {
			return err
		}
	}
}

// sink counts in 64 bits: a 32-bit int overflows past 2 GiB, and the
// report then differed from what the client sent.
func sink(ctx context.Context, c *cm.Conn, buf []byte, total int64) error {
	var bytes int64
	for i := int64(0); i < total; i++ {
		n, err := c.Recv(ctx, buf)
		if errors.Is(err, io.EOF) {
			return fmt.Errorf("the client ended after %d of %d messages", i, total)
		}
		if err != nil {
			return err
		}
		bytes += int64(n)
	}
	return c.Send(ctx, []byte(fmt.Sprintf("%d %d", total, bytes)))
}

func report(r result, idle time.Duration, asJSON bool) {
	if asJSON {
		json.NewEncoder(os.Stdout).Encode(r)
		return
	}
	line := fmt.Sprintf("%s %s: %d messages, %d bytes in %.2fs", r.Remote, r.Mode, r.Messages, r.Bytes, r.Seconds)
	if r.Error != "" {
		line += " (" + r.Error + ")"
	}
	if r.Shutdown {
		line += " (closed by the server's shutdown)"
	}
	if r.Idle {
		line += fmt.Sprintf(" (closed by the server's -idle: nothing received for %v)", idle)
	}
	fmt.Println(line)
}

// unspecified says whether address ("ip:port") names no particular host,
// as "0.0.0.0:7471", "[::]:7471" and ":7471" do.
func unspecified(address string) bool {
	host, _, err := net.SplitHostPort(address)
	if err != nil {
		return false // Listen reports the malformed address
	}
	ip := net.ParseIP(host)
	return host == "" || ip != nil && ip.IsUnspecified()
}
