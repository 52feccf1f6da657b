//go:build tools

// Package tools pins the etcd server program that scripts/control-plane.sh builds; it is never compiled.
package tools

import _ "go.etcd.io/etcd/server/v3"
