package main

import (
	"context"
	"testing"
	"time"
)

func TestOptionsCheck(t *testing.T) {
	ok := options{mode: "echo", size: 64, count: 1, conns: 1, depth: 1, nodes: 2, procs: 4, clients: 4}
	if err := ok.check(); err != nil {
		t.Fatalf("defaults refused: %v", err)
	}
	for name, mod := range map[string]func(*options){
		"unknown mode":      func(o *options) { o.mode = "bogus" },
		"raw latency":       func(o *options) { o.raw, o.mode = true, "latency" },
		"no connections":    func(o *options) { o.mode, o.conns = "connect", 0 },
		"negative conns":    func(o *options) { o.mode, o.conns = "connect", -1 },
		"no messages":       func(o *options) { o.count = 0 },
		"negative size":     func(o *options) { o.size = -1 },
		"too many nodes":    func(o *options) { o.mode, o.fabric, o.nodes = "xrc", true, 255 },
		"negative procs":    func(o *options) { o.mode, o.fabric, o.procs = "xrc", true, -1 },
		"no fabric clients": func(o *options) { o.mode, o.fabric, o.clients = "xrc", true, 0 },
	} {
		o := ok
		mod(&o)
		if o.check() == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

// The XRC demo on the in-memory fabric: every client reaches every server
// process, and the run reports its connections and its time.
func TestXRCDemoOnFabric(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	o := options{mode: "xrc", fabric: true, nodes: 2, procs: 3, clients: 2, json: true, size: 64, count: 1, conns: 1, depth: 1}
	r, err := run(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	if r.Count != 2*3*2 || r.Seconds <= 0 || r.Addr != "" {
		t.Fatalf("result %+v, want 12 connections, a time, no address", r)
	}
}
