/* SPDX-License-Identifier: MIT */
#include "projection.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

void th_projection(const double *R, uint32_t dk, uint32_t d, double *P)
{
	size_t w = (size_t)dk + d; /* [G | R], reduced to [I | G⁻¹ R] */
	double *a = malloc(sizeof(double) * dk * w);
	if (!a)
		abort();
	double dev = 0.0;
	for (uint32_t i = 0; i < dk; i++) {
		for (uint32_t j = 0; j < dk; j++) {
			double s = 0.0;
			for (uint32_t c = 0; c < d; c++)
				s += R[(size_t)i * d + c] * R[(size_t)j * d + c];
			a[i * w + j] = s;
			dev = fmax(dev, fabs(s - (i == j ? 1.0 : 0.0)));
		}
		memcpy(a + i * w + dk, R + (size_t)i * d, sizeof(double) * d);
	}
	if (!(dev > 0.0 && dev <= 0.0625)) {
		memcpy(P, R, sizeof(double) * dk * d);
		free(a);
		return;
	}
	for (uint32_t k = 0; k < dk; k++) {
		uint32_t piv = k;
		for (uint32_t i = k + 1; i < dk; i++)
			if (fabs(a[i * w + k]) > fabs(a[piv * w + k]))
				piv = i;
		if (piv != k)
			for (size_t j = 0; j < w; j++) {
				double t = a[k * w + j];
				a[k * w + j] = a[piv * w + j];
				a[piv * w + j] = t;
			}
		double inv = 1.0 / a[k * w + k];
		for (size_t j = 0; j < w; j++)
			a[k * w + j] *= inv;
		for (uint32_t i = 0; i < dk; i++) {
			double f = a[i * w + k];
			if (i == k || f == 0.0)
				continue;
			for (size_t j = 0; j < w; j++)
				a[i * w + j] -= f * a[k * w + j];
		}
	}
	for (uint32_t i = 0; i < dk; i++)
		memcpy(P + (size_t)i * d, a + i * w + dk, sizeof(double) * d);
	free(a);
}
