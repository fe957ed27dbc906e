//go:build !linux

package plugin

import "runtime"

func osYield() { runtime.Gosched() }
