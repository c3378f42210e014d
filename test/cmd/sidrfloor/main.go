//go:build linux && cgo

// Command sidrfloor measures the floor under any Go binding's SIDR exchange
// on this machine: the exchange that adds a logical XRC connection (package
// xrc) over a live uplink, with no engine and no library: a dialer's
// rdma_connect on a UDP id (SIDR REQ, 180 bytes of private data), the
// listener's CONNECT_REQUEST, its rdma_accept (SIDR REP, 136 bytes), the
// dialer's ESTABLISHED, both ids destroyed. It runs two ways in one process,
// in alternating rounds, each exchange on a new dialer id whose address and
// route are resolved first (timed apart: resolve_us, addr_us, route_us):
//
//   - "C": the whole exchange inside one C call, event reads blocking, as a
//     C program makes it;
//   - "Go": one cgo call per step, the goroutine that wants an event waiting
//     for it in the netpoller itself.
//
// test/bench-xrc.sh prints both beside BenchmarkHybridSIDRExchange (the same
// steps through goxrc's rdmacm package and the hybrid seam) and
// BenchmarkHybridAddLogicalConn (the engine).
//
// -idle D waits D, untimed, between resolving an id and its exchange: what
// idle costs the exchange itself.
//
// In the VM: sidrfloor -addr 10.77.0.1:20328 -count 50 -rounds 3 -json
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"math"
	"net/netip"
	"os"
	"time"

	"github.com/goxrc/goxrc/internal/quantile"
)

func main() {
	addr := flag.String("addr", "10.77.0.1:20328", "the listener's ip:port (IPv4; both ends are in this process)")
	count := flag.Int("count", 50, "timed exchanges per round and way")
	rounds := flag.Int("rounds", 3, "rounds, each C then Go")
	asJSON := flag.Bool("json", false, "print the result as JSON")
	idle := flag.Duration("idle", 0, "idle time before each timed exchange (after its id is resolved)")
	flag.Parse()
	res, err := run(*addr, *count, *rounds, *idle)
	if err != nil {
		fmt.Fprintln(os.Stderr, "sidrfloor:", err)
		os.Exit(1)
	}
	if *asJSON {
		json.NewEncoder(os.Stdout).Encode(res)
		return
	}
	fmt.Printf("SIDR exchange, median: in C %.0f us, one cgo call per step %.0f us (%.2fx); resolving an id %.0f us\n",
		res.CMedianUS, res.GoMedianUS, res.Ratio, res.ResolveUS)
}

// result is flat, so that test/bench-xrc.sh can pick a field with sed.
type result struct {
	Count      int                `json:"count"`
	Rounds     int                `json:"rounds"`
	IdleUS     float64            `json:"idle_us"`
	CMedianUS  float64            `json:"c_median_us"`  // whole exchanges
	GoMedianUS float64            `json:"go_median_us"` // whole exchanges
	Ratio      float64            `json:"ratio"`        // Go over C, medians
	ResolveUS  float64            `json:"resolve_us"`   // mean: create + resolve addr + route
	AddrUS     float64            `json:"addr_us"`      // mean: create + resolve addr
	RouteUS    float64            `json:"route_us"`     // mean: resolve route
	CStepsUS   map[string]float64 `json:"c_steps_us"`   // means
	GoStepsUS  map[string]float64 `json:"go_steps_us"`  // means
}

var stepNames = [5]string{"connect", "request", "accept", "reply", "destroy"}

func run(addr string, count, rounds int, idle time.Duration) (*result, error) {
	ap, err := netip.ParseAddrPort(addr)
	if err != nil || !ap.Addr().Is4() {
		return nil, fmt.Errorf("-addr %q: want IPv4 ip:port", addr)
	}
	if count < 1 || rounds < 1 || idle < 0 {
		return nil, fmt.Errorf("-count %d, -rounds %d, -idle %v: want at least 1, 1 and 0", count, rounds, idle)
	}
	ch, err := setup(ap.Addr().String(), int(ap.Port()))
	if err != nil {
		return nil, err
	}
	var addrs, routes time.Duration
	type acc struct {
		totals []time.Duration
		steps  [5]time.Duration
	}
	var inC, inGo acc
	once := func(a *acc, ex func() ([5]time.Duration, error)) error {
		addr, route, err := resolve()
		if err != nil {
			return err
		}
		addrs, routes = addrs+addr, routes+route
		time.Sleep(idle)
		steps, err := ex()
		if err != nil {
			return err
		}
		var total time.Duration
		for i, s := range steps {
			a.steps[i] += s
			total += s
		}
		a.totals = append(a.totals, total)
		return nil
	}
	for r := 0; r < rounds; r++ {
		for i := 0; i < count; i++ {
			if err := once(&inC, exchangeC); err != nil {
				return nil, err
			}
		}
		for i := 0; i < count; i++ {
			if err := once(&inGo, ch.exchangeGo); err != nil {
				return nil, err
			}
		}
	}
	summary := func(a *acc) (median float64, steps map[string]float64) {
		steps = map[string]float64{}
		for i, name := range stepNames {
			steps[name] = us(a.steps[i] / time.Duration(len(a.totals)))
		}
		return us(quantile.Median(a.totals)), steps
	}
	n := time.Duration(2 * count * rounds)
	res := &result{Count: count, Rounds: rounds, IdleUS: us(idle), ResolveUS: us((addrs + routes) / n), AddrUS: us(addrs / n), RouteUS: us(routes / n)}
	res.CMedianUS, res.CStepsUS = summary(&inC)
	res.GoMedianUS, res.GoStepsUS = summary(&inGo)
	res.Ratio = math.Round(res.GoMedianUS/res.CMedianUS*1000) / 1000
	return res, nil
}

// us is d in microseconds, to 0.1.
func us(d time.Duration) float64 { return math.Round(float64(d)/100) / 10 }
