//go:build tools

// Package tools pins the kwok program that scripts/control-plane.sh builds; it is never compiled.
package tools

import _ "sigs.k8s.io/kwok/cmd/kwok"
