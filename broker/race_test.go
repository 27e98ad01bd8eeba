//go:build race

package broker

// raceEnabled: the test binary runs under the race detector.
const raceEnabled = true
