package cm_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"github.com/goxrc/goxrc/cm"
	"github.com/goxrc/goxrc/xrc/memfabric"
)

// An echo exchange over RDMA. Without an RDMA device (as on most build
// machines) Listen fails, and the example says so. What it prints depends on
// the machine, so it is compiled, not run; ExampleWithFabric runs the same
// exchange anywhere.
func Example() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	l, err := cm.Listen(ctx, "10.77.0.1:0")
	if err != nil {
		fmt.Println("no RDMA here")
		return
	}
	defer l.Close()
	go func() {
		c, err := l.Accept(ctx)
		if err != nil {
			return
		}
		defer c.Close()
		buf := make([]byte, c.MaxRecvSize())
		n, err := c.Recv(ctx, buf)
		if err != nil {
			return
		}
		c.Send(ctx, buf[:n]) // a failure reaches the client's Recv
	}()
	c, err := cm.Dial(ctx, l.Addr().String())
	if err != nil {
		fmt.Println(err)
		return
	}
	defer c.Close()
	if err := c.Send(ctx, []byte("hello")); err != nil {
		fmt.Println(err)
		return
	}
	buf := make([]byte, c.MaxRecvSize())
	n, err := c.Recv(ctx, buf)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(string(buf[:n]))
}

// Code built on this package runs without RDMA hardware on an in-memory
// fabric: here two processes on two simulated nodes exchange a message over
// XRC, addressed by ip:port as on a device.
func ExampleWithFabric() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	dir, err := os.MkdirTemp("", "goxrc-example")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer os.RemoveAll(dir)
	f := memfabric.New()
	server, client := f.Node("10.1.0.1").Process(), f.Node("10.1.0.2").Process()

	l, err := cm.Listen(ctx, "10.1.0.1:7000", cm.WithFabric(server), cm.WithDomainPath(filepath.Join(dir, "server")))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer l.Close()
	go func() {
		c, err := l.Accept(ctx)
		if err != nil {
			return
		}
		defer c.Close()
		buf := make([]byte, 64)
		n, err := c.Recv(ctx, buf)
		if err == nil {
			c.Send(ctx, append([]byte("echo: "), buf[:n]...))
		}
	}()

	c, err := cm.Dial(ctx, "10.1.0.1:7000", cm.WithFabric(client), cm.WithDomainPath(filepath.Join(dir, "client")))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer c.Close()
	if err := c.Send(ctx, []byte("hello")); err != nil {
		fmt.Println(err)
		return
	}
	buf := make([]byte, 64)
	n, err := c.Recv(ctx, buf)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(string(buf[:n]))
	// Output: echo: hello
}

// A half-close, as a proxy makes one when its client has sent everything:
// the request side ends with CloseWrite, the server reads up to io.EOF and
// answers, and the answer still comes back. It runs on the in-memory fabric
// here; on a device the same code runs over RC.
func ExampleConn_CloseWrite() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	dir, err := os.MkdirTemp("", "goxrc-example")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer os.RemoveAll(dir)
	f := memfabric.New()
	server, client := f.Node("10.1.0.1").Process(), f.Node("10.1.0.2").Process()

	l, err := cm.Listen(ctx, "10.1.0.1:7000", cm.WithFabric(server), cm.WithDomainPath(filepath.Join(dir, "server")))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer l.Close()
	served := make(chan string, 1)
	go func() {
		c, err := l.Accept(ctx)
		if err != nil {
			served <- err.Error()
			return
		}
		s := c.NetConn()
		defer s.Close()
		req, err := io.ReadAll(s) // up to the client's CloseWrite
		if err != nil {
			served <- err.Error()
			return
		}
		_, err = s.Write([]byte("response to " + string(req)))
		served <- fmt.Sprint("server read: ", string(req), ", write error: ", err)
	}()

	c, err := cm.Dial(ctx, "10.1.0.1:7000", cm.WithFabric(client), cm.WithDomainPath(filepath.Join(dir, "client")))
	if err != nil {
		fmt.Println(err)
		return
	}
	conn := c.NetConn()
	defer conn.Close()
	if _, err := conn.Write([]byte("request")); err != nil {
		fmt.Println(err)
		return
	}
	if err := c.CloseWrite(); err != nil {
		fmt.Println(err)
		return
	}
	resp, err := io.ReadAll(conn) // up to the server's Close
	fmt.Println(<-served)
	fmt.Println("client read:", string(resp), err)
	// Output:
	// server read: request, write error: <nil>
	// client read: response to request <nil>
}

// net/http over RDMA: the server serves the listener's NetListener, and the
// client's Transport dials with a Dialer. Here on the in-memory fabric, so
// that the example runs anywhere; over a device, drop WithFabric and
// WithDomainPath and use the device's address.
func ExampleDialer() {
	dir, err := os.MkdirTemp("", "goxrc-example")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer os.RemoveAll(dir)
	f := memfabric.New()
	server, client := f.Node("10.1.0.1").Process(), f.Node("10.1.0.2").Process()

	l, err := cm.Listen(context.Background(), "10.1.0.1:8080", cm.WithFabric(server), cm.WithDomainPath(filepath.Join(dir, "server")))
	if err != nil {
		fmt.Println(err)
		return
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		host, _, _ := net.SplitHostPort(r.RemoteAddr)
		fmt.Fprintf(w, "%s %s from %s", r.Method, r.URL.Path, host)
	})}
	go srv.Serve(l.NetListener())
	defer srv.Close()

	d := &cm.Dialer{Options: []cm.Option{cm.WithFabric(client), cm.WithDomainPath(filepath.Join(dir, "client"))}}
	hc := &http.Client{Transport: &http.Transport{DialContext: d.DialContext}, Timeout: 10 * time.Second}
	defer hc.CloseIdleConnections()
	resp, err := hc.Get("http://10.1.0.1:8080/hello")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(resp.Status, string(body))
	// Output: 200 OK GET /hello from 10.1.0.2
}

// One-sided RDMA: the server lends the client a region it may write into
// and not read, and the client writes it without the server's CPU. It needs
// an RDMA device with RC (one-sided operations do not run over XRC or the
// in-memory fabric), so it is compiled here, not run.
func ExampleConn_RegisterMemory() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	l, err := cm.Listen(ctx, "10.77.0.1:7471")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer l.Close()
	served := make(chan struct{})
	go func() { // the server
		defer close(served)
		c, err := l.Accept(ctx)
		if err != nil {
			return
		}
		defer c.Close()
		inbox, err := c.RegisterMemory(4096, cm.RemoteWrite)
		if err != nil {
			return
		}
		defer inbox.Close() // revokes the client's access
		if c.Send(ctx, inbox.Descriptor().Marshal()) != nil {
			return
		}
		buf := make([]byte, c.MaxRecvSize())
		if _, err := c.Recv(ctx, buf); err == nil { // "written"
			fmt.Println(string(inbox.Bytes()[:5]))
		}
	}()
	c, err := cm.Dial(ctx, l.Addr().String())
	if err != nil {
		fmt.Println(err)
		return
	}
	defer c.Close()
	buf := make([]byte, c.MaxRecvSize())
	n, err := c.Recv(ctx, buf)
	if err != nil {
		fmt.Println(err)
		return
	}
	inbox, err := cm.UnmarshalRemoteRegion(buf[:n]) // untrusted: checked
	if err != nil {
		fmt.Println(err)
		return
	}
	src, err := c.RegisterMemory(4096, 0) // local only: the server gets no key
	if err != nil {
		fmt.Println(err)
		return
	}
	defer src.Close()
	copy(src.Bytes(), "hello")
	if err := c.WriteRemote(ctx, src, 0, 5, inbox, 0); err != nil {
		fmt.Println(err)
		return
	}
	if err := c.Send(ctx, []byte("written")); err != nil {
		fmt.Println(err)
		return
	}
	<-served
}
