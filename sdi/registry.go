package sdi

import (
	"fmt"
	"sort"
	"sync"
)

var registry struct {
	mu        sync.RWMutex
	factories map[string]Factory
}

// Register makes a built-in subdevice available by name. It is meant to be
// called from an init function and panics on an empty name, a nil factory or
// a duplicate name: those are programming errors found at start-up.
func Register(name string, f Factory) {
	if name == "" || f == nil {
		panic("sdi: Register with empty name or nil factory")
	}
	registry.mu.Lock()
	defer registry.mu.Unlock()
	if registry.factories == nil {
		registry.factories = make(map[string]Factory)
	}
	if _, dup := registry.factories[name]; dup {
		panic(fmt.Sprintf("sdi: subdevice %q registered twice", name))
	}
	registry.factories[name] = f
}

// Lookup returns the factory registered under name.
func Lookup(name string) (Factory, error) {
	registry.mu.RLock()
	defer registry.mu.RUnlock()
	f, ok := registry.factories[name]
	if !ok {
		return nil, fmt.Errorf("%w %q (built in: %v)", ErrUnknownSubDevice, name, namesLocked())
	}
	return f, nil
}

// Registered lists the names of the built-in subdevices, sorted.
func Registered() []string {
	registry.mu.RLock()
	defer registry.mu.RUnlock()
	return namesLocked()
}

func namesLocked() []string {
	names := make([]string, 0, len(registry.factories))
	for n := range registry.factories {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}
