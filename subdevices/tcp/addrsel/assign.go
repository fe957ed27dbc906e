package addrsel

import "slices"

// Assign returns a maximum-cardinality, maximum-weight matching of the
// bipartite graph whose edge (i, j) has weight w[i][j] (rows are left
// vertices, columns right ones; 0 means no edge; every row has the same
// length). The result lists [i, j] pairs by ascending i.
//
// Weights are lifted so that cardinality dominates: a positive weight w
// becomes w + K with K = max(w) * min(rows, cols), so one more edge outweighs
// any difference in the rest, and the Hungarian method (Kuhn-Munkres with
// potentials, O(n^2 m)) maximizes the lifted sum. It is deterministic: the
// same w always gives the same matching, which is what lets both ends of a
// connection agree without talking.
func Assign(w [][]Weight) [][2]int {
	n := len(w)
	if n == 0 || len(w[0]) == 0 {
		return nil
	}
	m := len(w[0])
	var maxW Weight
	for _, row := range w {
		for _, x := range row {
			maxW = max(maxW, x)
		}
	}
	if maxW <= 0 {
		return nil
	}
	k := int64(maxW) * int64(min(n, m))
	lift := func(x Weight) int64 {
		if x <= 0 {
			return 0
		}
		return int64(x) + k
	}
	// The method below wants rows <= columns; solve the transpose otherwise.
	transposed := n > m
	rows, cols := n, m
	if transposed {
		rows, cols = m, n
	}
	cost := func(i, j int) int64 { // 0-based; minimizing -lifted maximizes lifted
		if transposed {
			return -lift(w[j][i])
		}
		return -lift(w[i][j])
	}
	colOf := hungarian(rows, cols, cost)
	var out [][2]int
	for r, c := range colOf {
		i, j := r, c
		if transposed {
			i, j = c, r
		}
		if w[i][j] > 0 {
			out = append(out, [2]int{i, j})
		}
	}
	slices.SortFunc(out, func(a, b [2]int) int { return a[0] - b[0] })
	return out
}

// hungarian solves the rectangular assignment problem (rows <= cols) for
// minimum total cost and returns the column assigned to each row. It is the
// shortest-augmenting-path form with row and column potentials: each row is
// added by growing a Dijkstra-like tree over reduced costs until a free
// column is reached, then the path is flipped.
func hungarian(rows, cols int, cost func(i, j int) int64) []int {
	const inf = int64(1) << 62
	// 1-based; column 0 is the virtual root of each search.
	u := make([]int64, rows+1)
	v := make([]int64, cols+1)
	p := make([]int, cols+1) // p[j]: row matched to column j, 0 if free
	way := make([]int, cols+1)
	minv := make([]int64, cols+1)
	used := make([]bool, cols+1)
	for i := 1; i <= rows; i++ {
		p[0] = i
		j0 := 0
		for j := range minv {
			minv[j] = inf
			used[j] = false
		}
		for {
			used[j0] = true
			i0, delta, j1 := p[j0], inf, 0
			for j := 1; j <= cols; j++ {
				if used[j] {
					continue
				}
				if cur := cost(i0-1, j-1) - u[i0] - v[j]; cur < minv[j] {
					minv[j], way[j] = cur, j0
				}
				if minv[j] < delta {
					delta, j1 = minv[j], j
				}
			}
			for j := 0; j <= cols; j++ {
				if used[j] {
					u[p[j]] += delta
					v[j] -= delta
				} else {
					minv[j] -= delta
				}
			}
			j0 = j1
			if p[j0] == 0 {
				break
			}
		}
		for j0 != 0 {
			j1 := way[j0]
			p[j0] = p[j1]
			j0 = j1
		}
	}
	colOf := make([]int, rows)
	for j := 1; j <= cols; j++ {
		if p[j] != 0 {
			colOf[p[j]-1] = j - 1
		}
	}
	return colOf
}
