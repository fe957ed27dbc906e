package uds

import (
	"encoding/json"
	"fmt"

	"github.com/hpc-multidevice/multidevice/sdi"
)

// card is the business card: where the rank listens, and enough identity
// for a peer to refuse a card from another job, rank or host before it
// dials.
type card struct {
	Version int      `json:"v"`
	Host    string   `json:"host"`
	Job     string   `json:"job"`
	Rank    sdi.Rank `json:"rank"`
	Path    string   `json:"path"`
}

const cardVersion = 1

func (c card) encode() ([]byte, error) { return json.Marshal(c) }

// decodeCard parses a peer's card; every failure wraps
// sdi.ErrPeerUnreachable, since such a card gives no way to the peer.
func decodeCard(b []byte) (card, error) {
	var c card
	if err := json.Unmarshal(b, &c); err != nil {
		return card{}, fmt.Errorf("uds: card: %w: %v", sdi.ErrPeerUnreachable, err)
	}
	if c.Version != cardVersion || c.Path == "" || len(c.Path) > maxPathLen {
		return card{}, fmt.Errorf("uds: card: %w: version %d, path %q", sdi.ErrPeerUnreachable, c.Version, c.Path)
	}
	return c, nil
}
