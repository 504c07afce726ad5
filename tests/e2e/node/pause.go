// pause: the sandbox process of every Pod on the e2e suite's real node (the pause image that
// start-node.sh imports into containerd). It holds the Pod's namespaces open, reaps the
// zombies of a shared PID namespace, and exits on SIGINT or SIGTERM. Standard library only.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	signals := make(chan os.Signal, 16)
	signal.Notify(signals, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for s := range signals {
		if s != syscall.SIGCHLD {
			os.Exit(0)
		}
		for {
			var status syscall.WaitStatus
			pid, err := syscall.Wait4(-1, &status, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
}
