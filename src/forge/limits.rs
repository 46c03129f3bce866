//! How much of a repository previewd reads at most: the files of one folder, the bytes of one
//! file and of one commit's manifests. The files are code from a pull request, so every
//! forge's reader checks them here, from the listing where the forge gives sizes and again as
//! files are read.

use super::transport::ForgeApiError;

/// The most manifest files previewd reads from one repository folder.
pub const MAX_MANIFEST_FILES: usize = 200;
/// The largest manifest file previewd reads (1 MiB).
pub const MAX_MANIFEST_FILE_BYTES: usize = 1 << 20;
/// The most manifest text previewd reads for one commit (4 MiB, the render output limit).
pub const MAX_MANIFEST_BYTES: usize = 4 << 20;

/// Refuses a folder of more than [`MAX_MANIFEST_FILES`] manifests, before any is read.
pub(crate) fn check_manifest_count(path: &str, count: usize) -> Result<(), ForgeApiError> {
    if count > MAX_MANIFEST_FILES {
        return Err(ForgeApiError::ManifestsTooLarge {
            path: path.to_string(),
            problem: format!(
                "{count} manifest files, more than the limit of {MAX_MANIFEST_FILES}; none was read"
            ),
        });
    }
    Ok(())
}

/// Refuses a manifest file of more than [`MAX_MANIFEST_FILE_BYTES`] (`size` as the forge
/// lists it, or as read).
pub(crate) fn check_manifest_size(path: &str, size: u64) -> Result<(), ForgeApiError> {
    if size > MAX_MANIFEST_FILE_BYTES as u64 {
        return Err(ForgeApiError::ManifestsTooLarge {
            path: path.to_string(),
            problem: format!(
                "{size} bytes, more than the limit of {MAX_MANIFEST_FILE_BYTES} per manifest file"
            ),
        });
    }
    Ok(())
}

/// Refuses, from a listing that gives each file's size (GitHub's), a file over
/// [`MAX_MANIFEST_FILE_BYTES`] or files that add up to more than [`MAX_MANIFEST_BYTES`]: before
/// anything is downloaded. Sizes are the forge's word, so they are added without overflow; the
/// files read are checked again.
pub(crate) fn check_listed_sizes(
    path: &str,
    listed: impl IntoIterator<Item = (String, u64)>,
) -> Result<(), ForgeApiError> {
    let mut total = 0u64;
    for (name, size) in listed {
        check_manifest_size(&name, size)?;
        total = total.saturating_add(size);
    }
    check_total(path, usize::try_from(total).unwrap_or(usize::MAX))
}

/// Refuses manifests that add up to more than [`MAX_MANIFEST_BYTES`].
pub(crate) fn check_manifest_total(
    path: &str,
    files: &[(String, String)],
) -> Result<(), ForgeApiError> {
    check_total(path, files.iter().map(|(_, text)| text.len()).sum())
}

/// Refuses manifests of `total` bytes in all, more than [`MAX_MANIFEST_BYTES`].
pub(crate) fn check_total(path: &str, total: usize) -> Result<(), ForgeApiError> {
    if total > MAX_MANIFEST_BYTES {
        return Err(ForgeApiError::ManifestsTooLarge {
            path: path.to_string(),
            problem: format!(
                "{total} bytes of manifests, more than the limit of {MAX_MANIFEST_BYTES}"
            ),
        });
    }
    Ok(())
}

/// Whether a repository file is a manifest previewd reads.
pub(crate) fn is_yaml(name: &str) -> bool {
    name.ends_with(".yaml") || name.ends_with(".yml")
}
