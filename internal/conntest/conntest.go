// Package conntest holds checks of net.Conn behaviour that more than one
// package's tests run: over cm's fake transport on the host and over real
// soft-RoCE in the VM.
package conntest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// HalfClose checks a proxy's use of a half-close: client writes a request
// of n copies of "request " and half-closes (CloseWrite); server reads it to
// io.EOF, writes a response of n copies of "response " and closes; client
// reads that to io.EOF and closes. Pick n for a request and a response of
// many messages, more than a queue depth.
func HalfClose(t testing.TB, client, server net.Conn, n int) {
	t.Helper()
	hc, ok := client.(interface{ CloseWrite() error })
	require.True(t, ok, "%T has no CloseWrite", client)
	req := bytes.Repeat([]byte("request "), n)
	wrote := make(chan error, 1)
	go func() {
		_, err := client.Write(req)
		if err == nil {
			err = hc.CloseWrite()
		}
		wrote <- err
	}()
	got, err := io.ReadAll(server)
	require.NoError(t, err)
	require.Equal(t, req, got)
	require.NoError(t, <-wrote)
	resp := bytes.Repeat([]byte("response "), n)
	go func() {
		_, err := server.Write(resp)
		wrote <- errors.Join(err, server.Close())
	}()
	got, err = io.ReadAll(client)
	require.NoError(t, err)
	require.Equal(t, resp, got, "the response arrives whole after the request's side closed")
	require.NoError(t, <-wrote)
	require.NoError(t, client.Close())
}

// ClosedCall is one call on a closed object (nil, zero or Closed), with
// its check: F returns an error saying what was wrong with the result.
type ClosedCall struct {
	Name string
	F    func(ctx context.Context) error
}

// ClosedCalls runs each call as a subtest that fails when the call panics,
// its check fails, or it blocks for 5 s: a closed object has nothing that
// could ever wake a blocked call.
func ClosedCalls(t *testing.T, calls []ClosedCall) {
	t.Helper()
	for _, c := range calls {
		t.Run(c.Name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			done := make(chan error, 1)
			go func() {
				defer func() {
					if p := recover(); p != nil {
						done <- fmt.Errorf("panic: %v", p)
					}
				}()
				done <- c.F(ctx)
			}()
			select {
			case err := <-done:
				if err != nil {
					t.Error(err)
				}
			case <-ctx.Done():
				t.Error("blocked")
			}
		})
	}
}

// Is is a ClosedCall check: nil when got equals want.
func Is(got, want any) error {
	if got != want {
		return fmt.Errorf("got %v, want %v", got, want)
	}
	return nil
}

// Eventually polls cond every 5 ms until it holds, and fails t with what
// and cond's last word on the state if d passes first.
func Eventually(t testing.TB, d time.Duration, what string, cond func() (ok bool, state string)) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		ok, state := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: never happened; last: %s", what, state)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
