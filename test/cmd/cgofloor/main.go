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
// In the VM, with the same -count, -warmup and -rounds on both sides:
//
//	cgofloor -server -addr 10.77.0.1:7475 &
//	cgofloor -addr 10.77.0.1:7475 -json
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"net"
	"os"
	"runtime"
	"slices"
	"time"
)

func main() {
	addr := flag.String("addr", "10.77.0.1:7475", "server ip:port")
	server := flag.Bool("server", false, "answer one client, then exit")
	count := flag.Int("count", 5000, "timed round trips per round")
	warmup := flag.Int("warmup", 200, "untimed round trips before each round")
	rounds := flag.Int("rounds", 3, "rounds of each way, alternating C, Go, C, Go ...")
	asJSON := flag.Bool("json", false, "print the result as JSON")
	flag.Parse()
	host, port, err := net.SplitHostPort(*addr)
	if err == nil {
		err = setup(*server, host, port)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "cgofloor:", err)
		os.Exit(1)
	}
	defer teardown()
	// Non-nil: nil means untimed (the warm-ups).
	inC := make([]time.Duration, 0, *rounds**count)
	inGo := make([]time.Duration, 0, *rounds**count)
	for r := 0; r < *rounds; r++ {
		loopC(*server, *warmup, nil)
		inC = loopC(*server, *count, inC)
		loopGo(*server, *warmup, nil)
		inGo = loopGo(*server, *count, inGo)
	}
	if *server {
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
	slices.Sort(rtts)
	return float64(rtts[len(rtts)/2]) / 2 / 1e3
}

const (
	spinSlice = 10 * time.Microsecond
	spinYield = 4 * time.Millisecond
)

// loopGo runs n round trips from Go and appends the client's round-trip
// times to rtts (nil: untimed).
func loopGo(server bool, n int, rtts []time.Duration) []time.Duration {
	lastYield := time.Now()
	wait := func() {
		for !pollRecv(spinSlice) {
			if now := time.Now(); now.Sub(lastYield) > spinYield {
				lastYield = now
				runtime.Gosched()
			}
		}
	}
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
