package scaleout

// Holds reports whether this instance owns partition p now, for the admin
// service's answers.
func (g *Group) Holds(p int) bool { return g.holds(p) }
