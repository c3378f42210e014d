//go:build linux && cgo

// Command cgofloor measures the floor under any Go binding's ping-pong
// latency on this machine: a 64-byte send/receive ping-pong over one RC
// connection (made with librdmacm, no goxrc), run two ways in one process on
// the same connection, in alternating rounds:
//
//   - "C": the whole loop inside one C call, as ib_send_lat runs it;
//   - "Go": the same steps from Go, one cgo call to post (the consumed
//     receive buffer goes back and the send goes out in the same call) and
//     polling in 10 us C slices with a yield every 4 ms, as goxrc polls.
//
// Their ratio is what calling C once per step costs here, before any
// library logic; test/bench.sh prints it beside goxrc's ratio to
// ib_send_lat.
//
// With -bw SIZE it streams -count messages of SIZE bytes instead, much as
// ib_send_bw does by default (512 receives reposted as they are taken, 128
// sends in flight; but one send in 64 signaled, where ib_send_bw signals one
// in 100 up to 8 KiB and every one above, and after -warmup untimed
// messages, where ib_send_bw has none), ending with a 1-byte
// acknowledgement, the same two ways: the whole stream in one C call, then
// one cgo call per post or poll (the poll also reposts), polling in 10 us
// slices with a yield every 4 ms. That is the floor under goxrc's bandwidth
// beside ib_send_bw's.
//
// In the VM, with the same -count, -warmup, -rounds and -bw on both sides:
//
//	cgofloor -server -addr 10.77.0.1:7475 &
//	cgofloor -addr 10.77.0.1:7475 -json
//
// With -events the ping-pong sleeps on completion events instead of
// polling, as ib_send_lat -e does: in C, arm the CQ, look, and block in the
// completion channel's read; from Go, arm and look in one cgo call, then
// wait for the channel in the netpoller (the waiting goroutine itself) and
// take the event in one cgo call.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net"
	"os"
	"runtime"
	"time"

	"github.com/goxrc/goxrc/internal/fdpoll"
	"github.com/goxrc/goxrc/internal/quantile"
)

func main() {
	addr := flag.String("addr", "10.77.0.1:7475", "server ip:port")
	server := flag.Bool("server", false, "answer one client, then exit")
	count := flag.Int("count", 5000, "timed round trips per round")
	warmup := flag.Int("warmup", 200, "untimed round trips before each round")
	rounds := flag.Int("rounds", 3, "rounds of each way, alternating C, Go, C, Go ...")
	asJSON := flag.Bool("json", false, "print the result as JSON")
	bw := flag.Int("bw", 0, "stream messages of this many bytes instead of a 64 B ping-pong")
	events := flag.Bool("events", false, "ping-pong sleeping on completion events instead of polling")
	flag.Parse()
	host, port, err := net.SplitHostPort(*addr)
	if err == nil {
		size := 64
		if *bw > 0 {
			size = *bw
		}
		err = setup(*server, host, port, size, *bw > 0)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "cgofloor:", err)
		os.Exit(1)
	}
	defer teardown()
	if *bw > 0 {
		stream(*server, *bw, *count, *warmup, *rounds, *asJSON)
		return
	}
	// Non-nil: nil means untimed (the warm-ups).
	inC := make([]time.Duration, 0, *rounds**count)
	inGo := make([]time.Duration, 0, *rounds**count)
	wayC, wayGo := loopC, loopGo
	if *events {
		fd, err := fdpoll.Open(eventFD(), "completion channel")
		if err != nil {
			fmt.Fprintln(os.Stderr, "cgofloor:", err)
			os.Exit(1)
		}
		defer fd.Close()
		wayC = loopEventsC
		wayGo = func(server bool, n int, rtts []time.Duration) []time.Duration {
			return loopEventsGo(server, n, rtts, fd)
		}
	}
	for r := 0; r < *rounds; r++ {
		wayC(*server, *warmup, nil)
		inC = wayC(*server, *count, inC)
		wayGo(*server, *warmup, nil)
		inGo = wayGo(*server, *count, inGo)
	}
	if *server {
		if *rounds > 0 && *count+*warmup > 0 {
			lastSend() // before teardown: it would flush the last reply
		}
		return
	}
	res := result{Count: *count, Rounds: *rounds, CMedianUS: oneWay(inC), GoMedianUS: oneWay(inGo)}
	res.Ratio = res.GoMedianUS / res.CMedianUS
	if *asJSON {
		json.NewEncoder(os.Stdout).Encode(res)
		return
	}
	fmt.Printf("64 B one-way median: loop in C %.1f us, one cgo call per step %.1f us (%.2fx)\n", res.CMedianUS, res.GoMedianUS, res.Ratio)
}

type result struct {
	Count      int     `json:"count"`
	Rounds     int     `json:"rounds"`
	CMedianUS  float64 `json:"c_median_us"`
	GoMedianUS float64 `json:"go_median_us"`
	Ratio      float64 `json:"ratio"`
}

// oneWay returns the median round trip halved, in microseconds.
func oneWay(rtts []time.Duration) float64 {
	return float64(quantile.Median(rtts)) / 2 / 1e3
}

const (
	spinSlice = 10 * time.Microsecond
	spinYield = 4 * time.Millisecond
)

// loopGo runs n round trips from Go and appends the client's round-trip
// times to rtts (nil: untimed).
func loopGo(server bool, n int, rtts []time.Duration) []time.Duration {
	lastYield := time.Now()
	return pingPong(server, n, rtts, func() {
		for !pollRecv(spinSlice) {
			if now := time.Now(); now.Sub(lastYield) > spinYield {
				lastYield = now
				runtime.Gosched()
			}
		}
	})
}

// loopEventsGo is loopGo sleeping on completion events (-events): a wait
// arms the CQ and looks in one C call, and finding nothing, sleeps in the
// netpoller on the completion channel (this goroutine, no hand-off), then
// takes the event in one C call and looks again.
func loopEventsGo(server bool, n int, rtts []time.Duration, fd *fdpoll.FD) []time.Duration {
	return pingPong(server, n, rtts, func() {
		for !armPoll() {
			if err := fd.Wait(context.Background(), takeEvent); err != nil {
				fmt.Fprintln(os.Stderr, "cgofloor:", err)
				os.Exit(1)
			}
		}
	})
}

// pingPong runs n round trips from Go, waiting for each message with wait,
// and appends the client's round-trip times to rtts (nil: untimed).
func pingPong(server bool, n int, rtts []time.Duration, wait func()) []time.Duration {
	for i := 0; i < n; i++ {
		t := time.Now()
		if server {
			wait()
			send()
		} else {
			send()
			wait()
		}
		if rtts != nil {
			rtts = append(rtts, time.Since(t))
		}
	}
	return rtts
}

// streamResult is what -bw reports: the median rate of each way.
type streamResult struct {
	Size    int     `json:"size"`
	Count   int     `json:"count"`
	Rounds  int     `json:"rounds"`
	CMBps   float64 `json:"c_mb_per_s"`  // MB = 2^20 bytes, as ib_send_bw reports
	GoMBps  float64 `json:"go_mb_per_s"` // likewise
	GoOverC float64 `json:"ratio"`
}

// stream runs the streaming floor: rounds of C then Go, each after an
// untimed warm-up stream; the client reports the median rate of each way.
func stream(server bool, size, count, warmup, rounds int, asJSON bool) {
	var inC, inGo []float64
	mbps := func(d time.Duration) float64 { return float64(size) * float64(count) / d.Seconds() / (1 << 20) }
	for r := 0; r < rounds; r++ {
		streamC(server, warmup)
		t := time.Now()
		streamC(server, count)
		inC = append(inC, mbps(time.Since(t)))
		streamGo(server, warmup)
		t = time.Now()
		streamGo(server, count)
		inGo = append(inGo, mbps(time.Since(t)))
	}
	if server {
		return
	}
	res := streamResult{Size: size, Count: count, Rounds: rounds, CMBps: quantile.Median(inC), GoMBps: quantile.Median(inGo)}
	res.GoOverC = res.GoMBps / res.CMBps
	if asJSON {
		json.NewEncoder(os.Stdout).Encode(res)
		return
	}
	fmt.Printf("%d B stream: loop in C %.2f MB/s, one cgo call per step %.2f MB/s (%.2fx)\n", size, res.CMBps, res.GoMBps, res.GoOverC)
}

// streamGo runs a stream of n messages from Go, one cgo call per post (the
// sender) or per poll slice (the receiver), yielding every spinYield.
func streamGo(server bool, n int) {
	lastYield := time.Now()
	yield := func() {
		if now := time.Now(); now.Sub(lastYield) > spinYield {
			lastYield = now
			runtime.Gosched()
		}
	}
	if server {
		for got := 0; got < n; yield() {
			got += streamRecv(spinSlice, min(16, n-got))
		}
	} else {
		var done int64
		for i := 1; i <= n; i++ {
			streamSend(i, n, &done)
			yield()
		}
		for done < int64(n) {
			streamReap(&done)
			yield()
		}
	}
	streamAck(server)
}
