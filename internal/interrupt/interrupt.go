// Package interrupt gives the example programs the context that Ctrl-C
// (SIGINT) and SIGTERM end, with a way out when ending it is not enough.
package interrupt

import (
	"context"
	"errors"
	"os"
	"os/signal"
	"syscall"
)

// Context returns a context that the first SIGINT or SIGTERM ends. The
// signals' default handling comes back once it has ended, so that a second
// Ctrl-C kills a program whose shutdown hangs (a Close that waits for a
// vanished peer, up to its timeout) instead of going unheard. As with
// signal.NotifyContext, context.Cause names the signal.
func Context() (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancelCause(context.Background())
	c := make(chan os.Signal, 1)
	signal.Notify(c, os.Interrupt, syscall.SIGTERM)
	go func() {
		var cause error
		select {
		case s := <-c:
			cause = errors.New(s.String() + " signal received")
		case <-ctx.Done():
		}
		// Stop before cancel: a signal that comes once anyone has seen
		// ctx end finds the default handling back. NotifyContext's stop,
		// run after the end (an AfterFunc), left a moment in which c
		// took the second signal and nothing read it.
		signal.Stop(c)
		cancel(cause)
	}()
	return ctx, func() {
		signal.Stop(c)
		cancel(nil)
	}
}
