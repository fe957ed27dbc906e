//go:build race

package plugin_test

// raceEnabled trims the slowest tests under the race detector, where the
// host side of both data planes is what needs checking.
const raceEnabled = true
