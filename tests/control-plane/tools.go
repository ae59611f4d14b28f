//go:build tools

// Pins the two main packages this module builds, so `go mod tidy` keeps them.
package controlplane

import (
	_ "go.etcd.io/etcd/server/v3"
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
)
