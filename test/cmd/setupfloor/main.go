//go:build linux && cgo

// Command setupfloor measures the floor under any Go binding's connection
// set-up on this machine: rdma-core's cmtime client (its five timed steps:
// create id, resolve address, resolve route, create QP, connect, each for
// all connections at once) with no library, against cmtime's own server,
// one of two ways per run:
//
//   - "c": all of it inside one C call, event reads blocking, as cmtime
//     runs it;
//   - "go": from one goroutine, one cgo call per call and connection, the
//     events awaited in the netpoller.
//
// Both report cmtime's figure: the sum of the steps' wall times over the
// number of connections. Set against cmtime's own client, the "c" way shows
// how close this copy is to cmtime; set against the "c" way, the "go" way
// shows what running the same calls in a Go process costs here.
//
// In the VM, for each run: cmtime -b 10.77.0.1 -c 300 & then
//
//	setupfloor -addr 10.77.0.1:7471 -conns 300 -way go -json
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"math"
	"net/netip"
	"os"
	"time"
)

// result is flat, so that a shell script can pick a field with sed.
type result struct {
	Way       string             `json:"way"`
	Conns     int                `json:"conns"`
	PerConnUS float64            `json:"per_conn_us"`
	StepsUS   map[string]float64 `json:"steps_us"` // each step's wall time over conns
}

func main() {
	addr := flag.String("addr", "10.77.0.1:7471", "cmtime -b's ip:port (IPv4)")
	conns := flag.Int("conns", 100, "connections, as cmtime -c")
	way := flag.String("way", "go", "c (one C call) or go (one cgo call per call)")
	asJSON := flag.Bool("json", false, "print the result as JSON")
	flag.Parse()
	res, err := run(*addr, *conns, *way)
	if err != nil {
		fmt.Fprintln(os.Stderr, "setupfloor:", err)
		os.Exit(1)
	}
	if *asJSON {
		json.NewEncoder(os.Stdout).Encode(res)
		return
	}
	fmt.Printf("%d connections, cmtime's steps %s: %.0f us per connection\n", res.Conns, map[string]string{"c": "in one C call", "go": "from Go"}[res.Way], res.PerConnUS)
}

func run(addr string, conns int, way string) (*result, error) {
	ap, err := netip.ParseAddrPort(addr)
	if err != nil || !ap.Addr().Is4() {
		return nil, fmt.Errorf("-addr %q: want IPv4 ip:port", addr)
	}
	if conns < 1 {
		return nil, fmt.Errorf("-conns %d: want at least 1", conns)
	}
	if err := setup(ap.Addr().String(), int(ap.Port()), conns); err != nil {
		return nil, err
	}
	defer closeAll()
	var steps [5]time.Duration
	switch way {
	case "c":
		steps, err = allInC()
	case "go":
		steps, err = fromGo(conns)
	default:
		return nil, fmt.Errorf("-way %q: want c or go", way)
	}
	if err != nil {
		return nil, err
	}
	res := &result{Way: way, Conns: conns, StepsUS: map[string]float64{}}
	var sum float64
	for i, name := range stepNames {
		us := float64(steps[i]) / 1e3 / float64(conns)
		res.StepsUS[name] = math.Round(us*10) / 10
		sum += us
	}
	res.PerConnUS = math.Round(sum*10) / 10
	return res, nil
}
