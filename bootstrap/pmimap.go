package bootstrap

import (
	"fmt"
	"strconv"
)

// maxMapNumber bounds every number in a process mapping, so that sums of
// node ids and counts cannot overflow.
const maxMapNumber = 1 << 30

// parseProcessMapping turns the PMI_process_mapping attribute of a job of
// size ranks into the node number of every rank.
//
// The attribute is MPICH's rank map: "(vector," then blocks, then ")". A
// block (X,Y,Z) puts Z consecutive ranks on each of the Y nodes X, X+1, ...;
// a plain number X stands for (X,1,1); "[block,...]xN" repeats the bracketed
// blocks N times. When the blocks run out before the ranks do, they start
// over (Slurm's cyclic layouts and Hydra's "(vector,(0,1,1))" for a whole
// job on one node are written that way).
func parseProcessMapping(s string, size int) ([]int, error) {
	if size < 1 {
		return nil, fmt.Errorf("process mapping: job of %d ranks", size)
	}
	p := mapParser{s: s}
	items, err := p.parse()
	if err != nil {
		return nil, fmt.Errorf("process mapping %.64q: %w", s, err)
	}
	nodes := make([]int, 0, size)
	for len(nodes) < size {
		before := len(nodes)
		nodes = expandItems(nodes, items, size)
		if len(nodes) == before {
			return nil, fmt.Errorf("process mapping %.64q places no rank", s)
		}
	}
	return nodes, nil
}

// mapBlock is (node, nodes, per): per ranks on each of nodes nodes from node.
type mapBlock struct{ node, nodes, per int }

// mapItem is one block, or a group of blocks repeated times.
type mapItem struct {
	block  mapBlock
	group  []mapBlock
	repeat int
}

func expandBlock(out []int, b mapBlock, size int) []int {
	if b.per == 0 {
		return out
	}
	for i := 0; i < b.nodes; i++ {
		for j := 0; j < b.per; j++ {
			if len(out) == size {
				return out
			}
			out = append(out, b.node+i)
		}
	}
	return out
}

func expandItems(out []int, items []mapItem, size int) []int {
	for _, it := range items {
		if it.group == nil {
			out = expandBlock(out, it.block, size)
			continue
		}
		// A group that places no rank in one pass places none in a
		// billion; stop after the first.
		for r := 0; r < it.repeat && len(out) < size; r++ {
			before := len(out)
			for _, b := range it.group {
				out = expandBlock(out, b, size)
			}
			if len(out) == before {
				break
			}
		}
	}
	return out
}

// mapParser reads a process mapping; it is a recursive-descent parser over
// the grammar in parseProcessMapping's doc, allowing spaces between tokens.
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
		items = append(items, mapItem{block: b})
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
