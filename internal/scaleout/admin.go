package scaleout

import "context"

// Holds reports whether this instance owns partition p now, for the admin
// service's answers.
func (g *Group) Holds(p int) bool { return g.holds(p) }

// HoldsFence reports whether this instance owns partition p and the
// output stream's leader says p's fence is still this instance's: what an
// admin answer claims when it says the instance owns p. An instance whose
// partition another took keeps owning it here until its next batch is
// refused or its next balance pass, and an answer from it would claim a
// partition whose keys it no longer sees.
func (g *Group) HoldsFence(ctx context.Context, p int) bool {
	return g.holds(p) && g.fenceHeldBy(ctx, p, g.instance)
}
