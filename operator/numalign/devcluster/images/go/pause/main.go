// Command pause is the sandbox ("pause") container of numalign's local real node.
//
// It holds the pod's namespaces open: it waits for signals, reaps the children that
// are re-parented to it (it is PID 1 when the pod shares its process namespace) and
// exits 0 on SIGTERM or SIGINT.
package main

import (
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

func reap() {
	for {
		var status syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &status, syscall.WNOHANG, nil)
		if pid <= 0 || err != nil {
			return
		}
	}
}

func main() {
	if len(os.Args) > 1 && os.Args[1] == "-v" {
		fmt.Println("pause (numalign.local)")
		return
	}
	signals := make(chan os.Signal, 16)
	signal.Notify(signals, syscall.SIGTERM, syscall.SIGINT, syscall.SIGCHLD)
	reap() // children that ended before we listened
	for sig := range signals {
		switch sig {
		case syscall.SIGCHLD:
			reap()
		default:
			fmt.Fprintf(os.Stderr, "pause: %v, exiting\n", sig)
			os.Exit(0)
		}
	}
}
