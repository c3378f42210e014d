// Command client is goxrc's example RDMA client, the counterpart of
// examples/server. Modes:
//
//   - echo: sends -count messages and checks each echo byte for byte;
//   - latency: ping-pong of -size bytes; prints min, median and p99 of the
//     one-way latency (half the round trip, as ib_send_lat reports it);
//   - bandwidth: streams -count messages of -size bytes to the server's
//     sink and prints MB/s, in 10^6 bytes (ib_send_bw's MB is 2^20 bytes);
//   - connect: opens -conns connections at once and prints the time per
//     connection (as cmtime's connect step does);
//   - xrc: with -fabric, -clients client processes connected to -nodes
//     server nodes of -procs processes each on an in-memory XRC fabric,
//     and the QPs each node holds against what RC would need (with -json,
//     in "nodes");
//     without it, connections to the -addr servers (comma-separated) with
//     XRC preferred, each printed with the transport it got (on a device
//     without XRC, RC, and the log says why; with -json, in "conns").
//
// The command-line counterparts of latency, bandwidth and connect run
// against a server with the same flags, without ADDR (perftest) or with -b
// in place of -s (cmtime):
//
//	ib_send_lat -R -s SIZE -n COUNT ADDR
//	ib_send_bw -R -s SIZE -n COUNT ADDR
//	cmtime -s ADDR -c CONNS
//
// With -raw it sends one plain librdmacm message, of 16 bytes unless -size
// is given, and waits for one reply: what rdma-core's rdma_server example
// takes (one 16-byte receive) and answers (a buffer of its own, not an echo).
//
// The xrc mode echoes one message of -size bytes on each connection, with
// -fabric too (over the fabric, up to 1 MiB). A flag that the run does not
// use is refused, naming the flag and the modes it is for: -count outside
// echo (without -raw), latency and bandwidth, -warmup outside latency,
// -conns outside connect, -size, -depth, -busypoll and -keepalive in
// connect mode (which dials with a queue depth of 2 and 64-byte messages
// and sends nothing), -busypoll, -keepalive, -addr and -local with -fabric,
// -nodes, -procs and -clients without it, -raw outside echo and connect,
// -keepalive with -raw (raw connections send no probes).
//
// Every run but those probes the server every -keepalive (10 s) while it
// waits on it, as the server probes its clients: a server whose node
// vanished without a word fails the run once the probe's retries run out.
// Ctrl-C (or SIGTERM) ends the run and closes its connections (exit status
// 1, "client: interrupted"); a second Ctrl-C kills the client at once.
// -json prints the result as one object; its size is 0 in connect mode,
// which sends nothing.
//
//	client -addr 10.77.0.1:7471 -mode latency -size 64 -count 10000
//	client -addr 10.77.0.1:7471 -mode bandwidth -size 65536 -count 2000 -json
package main

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"net"
	"net/netip"
	"os"
	"runtime/pprof"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/goxrc/goxrc/cm"
	"github.com/goxrc/goxrc/internal/interrupt"
	"github.com/goxrc/goxrc/internal/quantile"
	"github.com/goxrc/goxrc/xrc"
)

type options struct {
	addr    string
	mode    string
	size    int
	count   int
	warmup  int
	conns   int
	depth   int
	raw     bool
	local   string
	json    bool
	fabric  bool
	nodes   int
	procs   int
	clients int
	// given has the bit of each flag given on the command line (flagBit):
	// check refuses those the run ignores.
	given     uint32
	progress  time.Duration
	busyPoll  time.Duration
	keepalive time.Duration
}

func main() {
	o, cpuProfile, err := parseFlags(flag.CommandLine, os.Args[1:]) // CommandLine exits on a flag's error
	if err == nil {
		err = o.check() // before -cpuprofile's file is created, or truncated
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "client:", err)
		os.Exit(2)
	}
	if cpuProfile != "" {
		f, err := os.Create(cpuProfile)
		if err == nil {
			err = pprof.StartCPUProfile(f)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "client:", err)
			os.Exit(1)
		}
		defer pprof.StopCPUProfile()
	}
	ctx, stop := interrupt.Context()
	defer stop()
	res, err := run(ctx, o)
	if err != nil && ctx.Err() != nil {
		// Say what ended the run, not what it cut short ("recv ...:
		// context canceled").
		err = fmt.Errorf("interrupted: %w", context.Cause(ctx))
	}
	if err == nil && o.json {
		err = json.NewEncoder(os.Stdout).Encode(res)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "client:", err)
		pprof.StopCPUProfile()
		os.Exit(1)
	}
	if !o.json {
		fmt.Println(res.summary())
	}
}

// rawSize is the message size of a -raw exchange when -size is not given:
// rdma-core's rdma_server (and rdma_client) post one 16-byte receive, so a
// longer message fails at the server.
const rawSize = 16

// parseFlags parses the command line args (without the program name) into
// options and the -cpuprofile path.
func parseFlags(fs *flag.FlagSet, args []string) (options, string, error) {
	var o options
	fs.StringVar(&o.addr, "addr", "10.77.0.1:7471", "server ip:port (xrc mode without -fabric: a comma-separated list; not with -fabric)")
	fs.StringVar(&o.mode, "mode", "echo", "echo, latency, bandwidth, connect or xrc")
	fs.IntVar(&o.size, "size", 64, "message size, bytes, 0 to 1 GiB (with -fabric, to 1 MiB; with -raw the default is 16, the one receive rdma-core's rdma_server posts; not in connect mode)")
	fs.IntVar(&o.count, "count", 1000, "messages (echo without -raw, latency, bandwidth)")
	fs.IntVar(&o.warmup, "warmup", 100, "untimed ping-pongs before a latency run (latency mode)")
	fs.IntVar(&o.conns, "conns", 100, "connections (connect mode)")
	fs.IntVar(&o.depth, "depth", 64, "queue depth, 2 to 4000 (not in connect mode: it dials with 2 and 64-byte messages)")
	fs.BoolVar(&o.raw, "raw", false, "plain librdmacm messages (no goxrc framing): send one message of -size bytes and wait for one reply (rdma-core's rdma_server answers with a buffer of its own, not an echo); connect mode: dial a plain librdmacm server such as cmtime -b")
	fs.StringVar(&o.local, "local", "", "dial from this IP, an address of an RDMA device's netdev (default: the route's; not with -fabric)")
	fs.BoolVar(&o.json, "json", false, "print the result as JSON")
	fs.BoolVar(&o.fabric, "fabric", false, "xrc mode: run servers and clients on an in-memory XRC fabric in this program")
	fs.IntVar(&o.nodes, "nodes", 2, "xrc mode with -fabric: server nodes")
	fs.IntVar(&o.procs, "procs", 4, "xrc mode with -fabric: server processes per node")
	fs.IntVar(&o.clients, "clients", 4, "xrc mode with -fabric: client processes")
	fs.DurationVar(&o.progress, "progress", 2*time.Second, "interval of the progress line on stderr (0: none)")
	fs.DurationVar(&o.busyPoll, "busypoll", cm.DefaultBusyPoll, "how long a waiting call polls before sleeping (not in connect mode or with -fabric)")
	fs.DurationVar(&o.keepalive, "keepalive", 10*time.Second, "probe the server this often while waiting on it, so that a server whose node vanished fails the run (0: off; not with -raw, in connect mode or with -fabric)")
	cpuProfile := fs.String("cpuprofile", "", "write a CPU profile of the run to this file")
	if err := fs.Parse(args); err != nil {
		return o, "", err
	}
	// Parsing stops at the first argument that is not a flag: the flags
	// after it would be dropped without a word (client 10.0.0.1:7471 -json).
	if fs.NArg() > 0 {
		return o, "", fmt.Errorf("unexpected argument %q: every setting is a flag (-addr ip:port, -mode ...)", fs.Arg(0))
	}
	fs.Visit(func(f *flag.Flag) { o.given |= flagBit(f.Name) })
	if o.raw && o.given&flagBit("size") == 0 {
		o.size = rawSize
	}
	return o, *cpuProfile, nil
}

// The runs a flag can be used in: the modes, with -raw and -fabric
// splitting echo and xrc (runKind).
const (
	runEcho      = "echo"
	runRaw       = "echo -raw"
	runLatency   = "latency"
	runBandwidth = "bandwidth"
	runConnect   = "connect"
	runXRC       = "xrc"
	runFabric    = "xrc -fabric"
)

// flagRuns says which runs use each flag (nil: every run). A flag given to
// a run that ignores it is refused: the run would measure something other
// than what was asked, without a word. Every flag of parseFlags is here
// (TestFlagRunsComplete); its index is its bit in options.given.
var flagRuns = []struct {
	name string
	runs []string
}{
	{"addr", []string{runEcho, runRaw, runLatency, runBandwidth, runConnect, runXRC}},
	{"local", []string{runEcho, runRaw, runLatency, runBandwidth, runConnect, runXRC}},
	{"size", []string{runEcho, runRaw, runLatency, runBandwidth, runXRC, runFabric}},
	{"depth", []string{runEcho, runRaw, runLatency, runBandwidth, runXRC, runFabric}},
	// The fabric's connections do not poll (cm.WithFabric), and connect
	// mode's make no Send or Recv.
	{"busypoll", []string{runEcho, runRaw, runLatency, runBandwidth, runXRC}},
	// Raw connections send no probes; connect mode makes no waits.
	{"keepalive", []string{runEcho, runLatency, runBandwidth, runXRC}},
	{"count", []string{runEcho, runLatency, runBandwidth}},
	{"warmup", []string{runLatency}},
	{"conns", []string{runConnect}},
	{"raw", []string{runRaw, runConnect}},
	{"fabric", []string{runFabric}},
	{"nodes", []string{runFabric}},
	{"procs", []string{runFabric}},
	{"clients", []string{runFabric}},
	{"mode", nil},
	{"json", nil},
	{"progress", nil},
	{"cpuprofile", nil},
}

// runNotes say why a run ignores what it does, where that is not plain.
var runNotes = map[string]string{
	runConnect: " (it dials with a queue depth of 2 and 64-byte messages, and sends nothing)",
	runFabric:  " (it runs on an in-memory fabric in this program)",
}

func flagBit(name string) uint32 {
	for i, f := range flagRuns {
		if f.name == name {
			return 1 << i
		}
	}
	return 0
}

// runKind names the run o asks for, as flagRuns does.
func (o options) runKind() string {
	switch {
	case o.mode == "echo" && o.raw:
		return runRaw
	case o.mode == "xrc" && o.fabric:
		return runFabric
	}
	return o.mode
}

// ignoredFlag refuses the first flag given that o's run does not use. A
// boolean flag counts as given when it is set (its default is false),
// whether or not parseFlags saw it, and only then: -raw=false asks for no
// raw run, so no run ignores it.
func (o options) ignoredFlag() error {
	given, run := o.given&^(flagBit("raw")|flagBit("fabric")), o.runKind()
	if o.raw {
		given |= flagBit("raw")
	}
	if o.fabric {
		given |= flagBit("fabric")
	}
	for _, f := range flagRuns {
		if given&flagBit(f.name) == 0 || f.runs == nil || slices.Contains(f.runs, run) {
			continue
		}
		last := len(f.runs) - 1
		uses := strings.Join(f.runs[:last], ", ")
		if last > 0 {
			uses += " or "
		}
		uses += f.runs[last]
		return fmt.Errorf("-%s has no effect in -mode %s%s: it is for -mode %s", f.name, run, runNotes[run], uses)
	}
	return nil
}

// maxConns bounds -conns (connect mode) and the fabric demo's connections.
const maxConns = 1 << 16

// maxNodeEndpoints is how many XRC endpoints a fabric node holds: the port
// numbers xrc.Config.Addr's port 0 picks from.
const maxNodeEndpoints = 20000

// check refuses flags that cannot make a run, before anything is dialed.
func (o options) check() error {
	switch o.mode {
	case "echo", "latency", "bandwidth", "connect", "xrc":
	default:
		return fmt.Errorf("unknown mode %q: echo, latency, bandwidth, connect or xrc", o.mode)
	}
	if err := o.ignoredFlag(); err != nil {
		return err
	}
	// A value out of range is refused naming its flag (one line listing
	// every flag's range left the user to find which). -size and -depth
	// have cm's bounds (WithMessageSize, WithQueueDepth): the dial refused
	// them only after -cpuprofile's file was truncated, as a failed run.
	for _, f := range []struct {
		name           string
		v, least, most int
	}{
		{"size", o.size, 0, 1 << 30},
		{"count", o.count, 1, math.MaxInt},
		{"warmup", o.warmup, 0, math.MaxInt},
		// Each is a dial in flight at once, with its QP and buffers: far
		// past any device's limit, and a slice of them before the first.
		{"conns", o.conns, 1, maxConns},
		{"depth", o.depth, 2, 4000},
	} {
		if f.v < f.least || f.v > f.most {
			if f.most == math.MaxInt {
				return fmt.Errorf("-%s %d: must be %d or more", f.name, f.v, f.least)
			}
			return fmt.Errorf("-%s %d: must be %d to %d", f.name, f.v, f.least, f.most)
		}
	}
	// The fabric's connections are XRC, whose messages carry at most 1 MiB:
	// a -size over it was taken, and the demo set up every server and
	// client, made and filled its message (1 GiB at most), then failed the
	// first send, with exit status 1 and after -cpuprofile's file was
	// truncated. (Without -fabric only the device can tell: RC carries it.)
	if o.fabric && o.size > xrc.MaxMessageSize {
		return fmt.Errorf("-size %d: must be 0 to %d with -fabric (the most an XRC message carries)", o.size, xrc.MaxMessageSize)
	}
	switch {
	case o.progress < 0 || o.busyPoll < 0 || o.keepalive < 0:
		// A negative -progress read as 0, and -busypoll failed at the dial.
		return errors.New("-progress, -busypoll and -keepalive must not be negative")
	case o.mode == "xrc" && o.fabric && (o.nodes < 1 || o.nodes > 254 || o.procs < 1 || o.clients < 1):
		return errors.New("xrc mode: -nodes must be 1 to 254, -procs and -clients 1 or more")
	case o.mode == "xrc" && o.fabric && (o.procs > maxNodeEndpoints || o.clients > maxNodeEndpoints):
		// Each process's endpoint takes one of its node's ports for port
		// 0 (xrc.Config.Addr: 30000-49999). More failed late, after
		// thousands of processes were made.
		return fmt.Errorf("xrc mode: -procs and -clients: at most %d (the processes of a node take a port each)", maxNodeEndpoints)
	case o.mode == "xrc" && o.fabric && int64(o.nodes)*int64(o.procs)*int64(o.clients) > maxConns:
		// Every connection is made at once in this program, with its
		// buffers: as -conns, checked so that no product overflows (in
		// int64: 254 x 65536 x 65536 passes a 32-bit int).
		return fmt.Errorf("xrc mode: -clients x -nodes x -procs connections: at most %d", maxConns)
	case !o.fabric:
		// A malformed -addr failed only at the dial, as a failed run,
		// after -cpuprofile's file was truncated; an entry of xrc mode's
		// list (dialed in order) only at its turn, after those before it
		// had been connected and echoed.
		addrs := []string{o.addr}
		if o.mode == "xrc" {
			addrs = strings.Split(o.addr, ",")
		}
		// -local as the dial reads it (cm.WithLocalAddr): it failed
		// there, as -addr did, as a failed run.
		local, err := netip.ParseAddr(o.local)
		if o.local != "" && err != nil {
			return fmt.Errorf("-local %q is not an IP address: %v", o.local, err)
		}
		local = local.Unmap()
		for _, a := range addrs {
			host, port, err := net.SplitHostPort(a)
			if err != nil || port == "" {
				return fmt.Errorf("-addr entry %q is not ip:port", a)
			}
			// The host as the dial reads it: empty or an unspecified
			// IP names no peer, and the dial refuses it (net.Dial
			// takes it for the local system, on no RDMA device).
			if ip, err := netip.ParseAddr(host); host == "" || err == nil && ip.Unmap().WithZone("").IsUnspecified() {
				return fmt.Errorf("-addr entry %q names no peer: give the server's address", a)
			}
			// A literal of the family -local is not: the dial has no
			// route between them ("no suitable address found").
			if ip, err := netip.ParseAddr(host); err == nil && local.IsValid() && !local.IsUnspecified() && ip.Unmap().Is4() != local.Is4() {
				return fmt.Errorf("-addr entry %q and -local %q are of different IP families", a, o.local)
			}
			// The port as the dial reads it: a number to 65535 or a
			// service name ("10.0.0.1:7471,x", a list outside xrc
			// mode, is one address, its port "7471,x").
			if _, err := net.LookupPort("tcp", port); err != nil {
				return fmt.Errorf("-addr entry %q: bad port %q: %v", a, port, err)
			}
		}
	}
	return nil
}

// text is where human-readable lines go: stdout, or stderr when stdout
// carries JSON.
func (o options) text() io.Writer {
	if o.json {
		return os.Stderr
	}
	return os.Stdout
}

// result is what a run measured; fields of other modes stay zero or nil.
type result struct {
	Mode    string  `json:"mode"`
	Addr    string  `json:"addr"`
	Size    int     `json:"size"` // 0 in connect mode, which sends nothing
	Count   int     `json:"count"`
	Seconds float64 `json:"seconds"`
	// A mode's figures, each set only by its mode, so that -json has all
	// of that mode's (a 0 too: MB/s of empty messages) and no other's.
	*LatencyFigures
	*BandwidthFigures
	*ConnectFigures
	// Nodes is the xrc -fabric demo's table, so that -json carries what
	// the demo shows and not only its time.
	Nodes []qpRow `json:"nodes,omitempty"`
	// Conns is the xrc mode's connections without -fabric, each with the
	// transport it got, as its text lines say.
	Conns []connRow `json:"conns,omitempty"`
}

// LatencyFigures are the latency mode's: one way, half a round trip.
type LatencyFigures struct {
	MinUS    float64 `json:"min_us"`
	MedianUS float64 `json:"median_us"`
	P99US    float64 `json:"p99_us"`
}

// BandwidthFigures are the bandwidth mode's, over the stream alone.
type BandwidthFigures struct {
	MBPerSec   float64 `json:"mb_per_s"`
	MsgsPerSec float64 `json:"msgs_per_s"`
}

// ConnectFigures are the connect mode's.
type ConnectFigures struct {
	PerConnUS float64 `json:"per_conn_us"`
}

// streamed is the bandwidth of count messages of size bytes in secs.
func streamed(size, count int, secs float64) *BandwidthFigures {
	return &BandwidthFigures{MBPerSec: float64(size) * float64(count) / secs / 1e6, MsgsPerSec: float64(count) / secs}
}

// connRow is a connection of the xrc mode without -fabric.
type connRow struct {
	Addr      string `json:"addr"`
	Transport string `json:"transport"`        // XRC or RC
	Reason    string `json:"reason,omitempty"` // why RC, as cm logs it
}

// qpRow is a node's row of the fabric demo's table: its XRC QPs against
// the RC QPs its connections would need.
type qpRow struct {
	Node       string `json:"node"`
	INIs       int    `json:"inis"`
	TGTs       int    `json:"tgts"`
	TGTHandles int    `json:"tgt_handles"`
	XRCQPs     int    `json:"xrc_qps"`
	RCQPs      int    `json:"rc_qps"`
}

func (r result) summary() string {
	switch r.Mode {
	case "latency":
		return fmt.Sprintf("latency %d bytes x %d: one-way min %.2f us, median %.2f us, p99 %.2f us", r.Size, r.Count, r.MinUS, r.MedianUS, r.P99US)
	case "bandwidth":
		return fmt.Sprintf("bandwidth %d bytes x %d: %.2f MB/s, %.0f msgs/s in %.2fs", r.Size, r.Count, r.MBPerSec, r.MsgsPerSec, r.Seconds)
	case "connect":
		return fmt.Sprintf("connect %d connections: %.0f us per connection, %.2fs in all", r.Count, r.PerConnUS, r.Seconds)
	}
	if r.Mode == "xrc" {
		return fmt.Sprintf("xrc: %d connections echoed", r.Count)
	}
	if r.Mode == "raw" {
		return fmt.Sprintf("raw exchange with %s: one message each way, %.2fs", r.Addr, r.Seconds)
	}
	return fmt.Sprintf("%s %d messages of %d bytes: all intact, %.2fs", r.Mode, r.Count, r.Size, r.Seconds)
}

// dial is cm.Dial, for -addr; the tests dial over an in-memory fabric.
var dial = cm.Dial

func run(ctx context.Context, o options) (result, error) {
	r := result{Mode: o.mode, Addr: o.addr, Size: o.size, Count: o.count}
	if o.mode == "connect" {
		return connect(ctx, o, r)
	}
	if o.mode == "xrc" {
		return xrcDemo(ctx, o)
	}
	opts := o.dialOptions(cm.WithMessageSize(max(o.size, 64)), cm.WithQueueDepth(o.depth), cm.WithBusyPoll(o.busyPoll))
	c, err := dial(ctx, o.addr, opts...)
	if err != nil {
		return r, err
	}
	defer c.Close()
	if o.raw {
		// One message each way: -count (refused with -raw) is not the
		// run's, nor is its default the progress line's total.
		r.Mode, r.Count = "raw", 1
	}
	p := newProgress(o.progress, r.Mode, r.Count)
	defer p.stop()
	start := time.Now()
	switch {
	case o.raw:
		err = rawExchange(ctx, c, o.size, o.text())
	case o.mode == "echo":
		err = greet(ctx, c, "echo")
		if err == nil {
			err = echo(ctx, c, o.size, o.count, p)
		}
	case o.mode == "latency":
		err = greet(ctx, c, "echo")
		if err == nil {
			err = latency(ctx, c, o, &r, p)
		}
	case o.mode == "bandwidth":
		err = greet(ctx, c, fmt.Sprintf("sink %d", o.count))
		streamStart := time.Now() // the stream and the server's report, not the request
		if err == nil {
			err = bandwidth(ctx, c, o, p)
		}
		r.BandwidthFigures = streamed(o.size, o.count, time.Since(streamStart).Seconds())
	default:
		return r, fmt.Errorf("unknown mode %q", o.mode)
	}
	r.Seconds = time.Since(start).Seconds()
	return r, closedEarly(err, o.addr, p.count(), r.Count)
}

// closedEarly gives a Recv's io.EOF its meaning, which alone printed
// "client: EOF": the server at addr closed the connection before the run
// had its total of messages.
func closedEarly(err error, addr string, done, total int) error {
	if errors.Is(err, io.EOF) {
		return fmt.Errorf("%s closed the connection after %d of %d messages", addr, done, total)
	}
	return err
}

func greet(ctx context.Context, c *cm.Conn, mode string) error {
	return c.Send(ctx, []byte(mode))
}

func echo(ctx context.Context, c *cm.Conn, size, count int, p *progress) error {
	msg := make([]byte, size)
	buf := make([]byte, size)
	for i := 0; i < count; i++ {
		for j := range msg {
			msg[j] = byte(i*7 + j)
		}
		if err := c.Send(ctx, msg); err != nil {
			return err
		}
		n, err := c.Recv(ctx, buf)
		if err != nil {
			return err
		}
		if !bytes.Equal(msg, buf[:n]) {
			return fmt.Errorf("echo %d differs from what was sent", i)
		}
		p.add(1)
	}
	return nil
}

// rawExchange sends one message and waits for one reply, as rdma_client
// does: rdma_server answers with a buffer of its own, not an echo.
func rawExchange(ctx context.Context, c *cm.Conn, size int, text io.Writer) error {
	if err := c.Send(ctx, make([]byte, size)); err != nil {
		return err
	}
	buf := make([]byte, c.MaxRecvSize())
	n, err := c.Recv(ctx, buf)
	if err != nil {
		return err
	}
	fmt.Fprintf(text, "raw reply: %d bytes\n", n)
	return nil
}

func latency(ctx context.Context, c *cm.Conn, o options, r *result, p *progress) error {
	msg := make([]byte, o.size)
	buf := make([]byte, o.size)
	// -count is the user's: a huge one must run (until interrupted), not
	// fail to allocate its samples up front.
	rtts := make([]time.Duration, 0, min(o.count, 1<<20))
	// One clock read per round trip, each ending one and starting the
	// next: a read costs half a microsecond under emulation.
	prev := time.Now()
	for i := -o.warmup; i < o.count; i++ {
		if err := c.Send(ctx, msg); err != nil {
			return err
		}
		if _, err := c.Recv(ctx, buf); err != nil {
			return err
		}
		now := time.Now()
		if i >= 0 {
			rtts = append(rtts, now.Sub(prev))
			p.add(1)
		}
		prev = now
	}
	if len(rtts) == 0 {
		return errors.New("no samples: -count must be positive")
	}
	us := func(d time.Duration) float64 { return float64(d) / 2 / 1e3 } // one way
	r.LatencyFigures = &LatencyFigures{MinUS: us(slices.Min(rtts)), MedianUS: us(quantile.Median(rtts)), P99US: us(quantile.Rank(rtts, 99))}
	return nil
}

func bandwidth(ctx context.Context, c *cm.Conn, o options, p *progress) error {
	msg := make([]byte, o.size)
	for i := 0; i < o.count; i++ {
		if err := c.Send(ctx, msg); err != nil {
			return err
		}
		p.add(1)
	}
	buf := make([]byte, 64)
	n, err := c.Recv(ctx, buf)
	if err != nil {
		return err
	}
	if want := sinkReport(o.count, o.size); string(buf[:n]) != want {
		return fmt.Errorf("server received %q, want %q", buf[:n], want)
	}
	return nil
}

// sinkReport is the report the server's sink sends after count messages
// of size bytes: the count and the bytes, in 64 bits (a 32-bit int
// overflows past 2 GiB, a minute of a fast run, and the run failed).
func sinkReport(count, size int) string {
	return fmt.Sprintf("%d %d", count, int64(count)*int64(size))
}

// connect dials -conns connections at once, as cmtime does, and closes them.
// dialOptions adds the flags every RC dial takes to opts.
func (o options) dialOptions(opts ...cm.Option) []cm.Option {
	if o.raw {
		opts = append(opts, cm.WithRawMessages()) // a plain librdmacm server (cmtime -b) sends no hello
	} else if o.keepalive > 0 && o.mode != "connect" {
		// Without probes a run blocked on a reply or report from a
		// server whose node vanished without a word waits for ever.
		// (Connect mode waits on nothing; its dials stay as timed.)
		opts = append(opts, cm.WithKeepalive(o.keepalive))
	}
	if o.local != "" {
		opts = append(opts, cm.WithLocalAddr(o.local))
	}
	return opts
}

func connect(ctx context.Context, o options, r result) (result, error) {
	r.Count, r.Size = o.conns, 0
	// One connection first, held open: librdmacm's and the device's
	// one-time set-up then stay out of the timing. (cmtime opens only its
	// event channel before its timed steps; librdmacm opens the device and
	// its PD in the first resolve, inside cmtime's timing: this favours
	// goxrc, see docs/benchmarks.md.)
	opts := o.dialOptions(cm.WithQueueDepth(2), cm.WithMessageSize(64))
	warm, err := dial(ctx, o.addr, opts...)
	if err != nil {
		return r, err
	}
	defer warm.Close()
	conns := make([]*cm.Conn, o.conns)
	errs := make([]error, o.conns)
	p := newProgress(o.progress, "connect", o.conns)
	start := time.Now()
	var wg sync.WaitGroup
	for i := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			conns[i], errs[i] = dial(ctx, o.addr, opts...)
			if errs[i] == nil {
				p.add(1) // the progress line counts connections made
			}
		}()
	}
	wg.Wait()
	r.Seconds = time.Since(start).Seconds()
	r.ConnectFigures = &ConnectFigures{PerConnUS: r.Seconds * 1e6 / float64(o.conns)}
	p.stop()
	for _, c := range conns {
		if c != nil {
			wg.Add(1)
			go func() { defer wg.Done(); c.Close() }()
		}
	}
	wg.Wait()
	return r, dialsFailed(errs)
}

// dialsFailed sums up connect mode's failed dials in one line: how many,
// and the first one's error (which errors.Is and errors.As reach). Listing
// them all put up to -conns lines, most alike, on stderr.
func dialsFailed(errs []error) error {
	var first error
	failed := 0
	for _, err := range errs {
		if err != nil {
			first = cmp.Or(first, err)
			failed++
		}
	}
	if failed == 0 {
		return nil
	}
	return fmt.Errorf("%d of %d dials failed, the first with: %w", failed, len(errs), first)
}

// progress prints a line on stderr every interval while a run lasts.
type progress struct {
	mu     sync.Mutex
	done   int
	total  int
	quit   chan struct{}
	exited chan struct{} // closed once the printer has returned
	once   sync.Once
}

func newProgress(every time.Duration, what string, total int) *progress {
	return newProgressTo(os.Stderr, every, what, total)
}

func newProgressTo(w io.Writer, every time.Duration, what string, total int) *progress {
	p := &progress{total: total, quit: make(chan struct{}), exited: make(chan struct{})}
	if every <= 0 {
		close(p.exited)
		return p
	}
	start := time.Now()
	go func() {
		defer close(p.exited)
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-p.quit:
				return
			case <-t.C:
				p.mu.Lock()
				d := p.done
				p.mu.Unlock()
				fmt.Fprintf(w, "%s: %d/%d after %.0fs\n", what, d, p.total, time.Since(start).Seconds())
			}
		}
	}()
	return p
}

func (p *progress) add(n int) { p.mu.Lock(); p.done += n; p.mu.Unlock() }

func (p *progress) count() int { p.mu.Lock(); defer p.mu.Unlock(); return p.done }

// stop ends the lines, and returns once the last is out: one printed
// after it came among (or after) the run's result.
func (p *progress) stop() {
	p.once.Do(func() { close(p.quit) })
	<-p.exited
}
