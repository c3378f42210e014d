// Package interrupt gives the example programs the context that Ctrl-C
// (SIGINT) and SIGTERM end, with a way out when ending it is not enough.
package interrupt

import (
	"context"
	"os"
	"os/signal"
	"syscall"
)

// Context returns a context that the first SIGINT or SIGTERM ends. The
// signals' default handling comes back once it has ended, so that a second
// Ctrl-C kills a program whose shutdown hangs (a Close that waits for a
// vanished peer, up to its timeout) instead of going unheard.
func Context() (context.Context, context.CancelFunc) {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	context.AfterFunc(ctx, stop)
	return ctx, stop
}
