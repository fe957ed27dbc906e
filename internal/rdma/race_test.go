//go:build race

package rdma_test

// raceEnabled trims TestConformance's configurations under the race
// detector, where one run of each engine path is what needs checking.
const raceEnabled = true
