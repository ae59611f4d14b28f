// The pod sandbox ("pause") program of the one-node test cluster: it holds the pod's namespaces
// and sleeps until it is told to stop. Built here because no image registry is reachable.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	<-stop
}
