//go:build tools

// Pins the helm command for `go build helm.sh/helm/v3/cmd/helm`.
package tools

import _ "helm.sh/helm/v3/cmd/helm"
