package bootstrap

import (
	"fmt"
	"strconv"
)

// maxMapNumber bounds every number in a process mapping, so that sums of
// node ids and counts cannot overflow.
const maxMapNumber = 1 << 30

// processMappingNode returns the node of rank in the PMI_process_mapping
// attribute s.
//
// The attribute is MPICH's rank map: "(vector," then blocks, then ")". A
// block (X,Y,Z) puts Z consecutive ranks on each of the Y nodes X, X+1, ...;
// a plain number X stands for (X,1,1); "[block,...]xN" repeats the bracketed
// blocks N times. When the blocks run out before the ranks do, they start
// over (Slurm's cyclic layouts and Hydra's "(vector,(0,1,1))" for a whole
// job on one node are written that way).
//
// The node is counted out block by block rather than by listing the node of
// every rank before this one: rank comes from the process manager, and a
// broken one must not make a rank allocate without bound.
func processMappingNode(s string, rank int) (int, error) {
	if rank < 0 {
		return 0, fmt.Errorf("process mapping: rank %d", rank)
	}
	p := mapParser{s: s}
	items, err := p.parse()
	if err != nil {
		return 0, fmt.Errorf("process mapping %.64q: %w", s, err)
	}
	node, pass, ok := placeItems(items, rank)
	if ok {
		return node, nil
	}
	if pass == 0 {
		return 0, fmt.Errorf("process mapping %.64q places no rank", s)
	}
	// The blocks start over after each pass, so rank sits where rank%pass
	// does in the first.
	node, _, _ = placeItems(items, rank%pass)
	return node, nil
}

// mapBlock is (node, nodes, per): per ranks on each of nodes nodes from node.
type mapBlock struct{ node, nodes, per int }

// mapItem is a group of blocks repeated times; a plain block is a group of
// one, once.
type mapItem struct {
	group  []mapBlock
	repeat int
}

// placeBlocks finds rank among the ranks that one pass over blocks places.
// When the pass places at most rank ranks, ok is false and placed says how
// many. Nothing is multiplied before it is known not to exceed rank, so
// nothing overflows.
func placeBlocks(blocks []mapBlock, rank int) (node, placed int, ok bool) {
	left := rank
	for _, b := range blocks {
		if b.per == 0 {
			continue
		}
		if q := left / b.per; q < b.nodes {
			return b.node + q, 0, true
		}
		left -= b.nodes * b.per
	}
	return 0, rank - left, false
}

// placeItems is placeBlocks over items, each group repeated.
func placeItems(items []mapItem, rank int) (node, placed int, ok bool) {
	left := rank
	for _, it := range items {
		if it.repeat == 0 {
			continue
		}
		node, once, ok := placeBlocks(it.group, left)
		if ok {
			return node, 0, true
		}
		if once == 0 {
			continue
		}
		if left/once < it.repeat {
			node, _, _ = placeBlocks(it.group, left%once)
			return node, 0, true
		}
		left -= it.repeat * once
	}
	return 0, rank - left, false
}

// mapParser reads a process mapping; it is a recursive-descent parser over
// the grammar in processMappingNode's doc, allowing spaces between tokens.
type mapParser struct {
	s   string
	pos int
}

func (p *mapParser) errorf(format string, args ...any) error {
	return fmt.Errorf("at byte %d: %s", p.pos, fmt.Sprintf(format, args...))
}

func (p *mapParser) skipSpace() {
	for p.pos < len(p.s) && (p.s[p.pos] == ' ' || p.s[p.pos] == '\t' || p.s[p.pos] == '\n') {
		p.pos++
	}
}

func (p *mapParser) peek() byte {
	p.skipSpace()
	if p.pos < len(p.s) {
		return p.s[p.pos]
	}
	return 0
}

func (p *mapParser) expect(tok string) error {
	p.skipSpace()
	if len(p.s)-p.pos < len(tok) || p.s[p.pos:p.pos+len(tok)] != tok {
		return p.errorf("want %q", tok)
	}
	p.pos += len(tok)
	return nil
}

func (p *mapParser) number() (int, error) {
	p.skipSpace()
	start := p.pos
	for p.pos < len(p.s) && p.s[p.pos] >= '0' && p.s[p.pos] <= '9' {
		p.pos++
	}
	if start == p.pos {
		return 0, p.errorf("want a number")
	}
	n, err := strconv.Atoi(p.s[start:p.pos])
	if err != nil || n > maxMapNumber {
		return 0, p.errorf("number %.12s too large", p.s[start:p.pos])
	}
	return n, nil
}

func (p *mapParser) parse() ([]mapItem, error) {
	if err := p.expect("("); err != nil {
		return nil, err
	}
	if err := p.expect("vector"); err != nil {
		return nil, err
	}
	var items []mapItem
	for p.peek() == ',' {
		p.pos++
		if p.peek() == '[' {
			p.pos++
			var group []mapBlock
			for {
				b, err := p.block()
				if err != nil {
					return nil, err
				}
				group = append(group, b)
				if p.peek() != ',' {
					break
				}
				p.pos++
			}
			if err := p.expect("]x"); err != nil {
				return nil, err
			}
			n, err := p.number()
			if err != nil {
				return nil, err
			}
			items = append(items, mapItem{group: group, repeat: n})
			continue
		}
		b, err := p.block()
		if err != nil {
			return nil, err
		}
		items = append(items, mapItem{group: []mapBlock{b}, repeat: 1})
	}
	if err := p.expect(")"); err != nil {
		return nil, err
	}
	if p.skipSpace(); p.pos != len(p.s) {
		return nil, p.errorf("trailing text")
	}
	if len(items) == 0 {
		return nil, p.errorf("no blocks")
	}
	return items, nil
}

func (p *mapParser) block() (mapBlock, error) {
	if p.peek() != '(' {
		n, err := p.number()
		return mapBlock{node: n, nodes: 1, per: 1}, err
	}
	p.pos++
	var b mapBlock
	var err error
	for i, dst := range []*int{&b.node, &b.nodes, &b.per} {
		if i > 0 {
			if err = p.expect(","); err != nil {
				return b, err
			}
		}
		if *dst, err = p.number(); err != nil {
			return b, err
		}
	}
	return b, p.expect(")")
}
